"""The policy model: base model loading, the tiny family and its tokenizer, supervised training, SFT warm-up, caches."""
