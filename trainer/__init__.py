"""The bundled MoE GPT trainer: `python -m trainer --recipe FILE --out DIR` (also under torchrun)."""
