"""The experiment configs (ml_collections, one file per experiment) and their shared
helpers (`configs/common.py`)."""
