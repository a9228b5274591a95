"""Training: corpora (`corpora` reads the formats, `data` splits the text), tokenizers (`tokenizers`,
with `token_cache` and `tokenized` turning split text into cached token streams, `metrics` for bits
per byte), proxy recipes (`recipe`), the training loop and its proxy runs (`proxy`), and training an
exported allocation for real (`train`)."""
