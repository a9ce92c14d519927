"""Interfaces: the `nest` command line and the Megatron-LM export."""
