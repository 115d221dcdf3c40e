"""The demo world's tools: write its datasets in real layouts (`synthetic_layout`), COOT's and
TVR / TVC's feature files (`coot_synthetic`, `tvr_synthetic`), the VideoCC mining corpus
(`mining_world`), and transcribe its spoken captions (`smit_asr`); each runs as
`python -m avworld.tools.<tool>`."""
