"""Training recipes: a model, its data, its loss and its evaluation, as the CLI and examples run them."""
