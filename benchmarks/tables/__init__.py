"""The papers' tables and ablations, rerun at demo scale on the synthetic world."""
