"""nmt-serve against LibreTranslate on the same weights: `python -m bench.libretranslate`."""
