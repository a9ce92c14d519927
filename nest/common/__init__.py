"""Infrastructure every layer uses: errors, the input boundary, atomic writes, progress."""
