"""Training: corpora and tokenizers (`data`), proxy recipes (`recipe`), the training loop and its
proxy runs (`proxy`), and training an exported allocation for real (`train`)."""
