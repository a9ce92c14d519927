"""The cost model against measurements: single blocks, published runs, uncertainty bands."""
