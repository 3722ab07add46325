"""The Studio's services, one per tab (no Gradio import): `train` (presets, uploads, start / stop / resume,
the live status and charts), `compare` (comparisons and the stage x task matrix), `tryout` (two models, one
question), `runs` (past runs: list, open, delete). `shared` holds what they all use.
"""
