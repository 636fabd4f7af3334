"""What a user touches: the `shardplan` command line (`cli`), `check`,
`compare`, `explain`, `export`, the Shardy annotation of a planned module
(`annotate`) and the JAX bridge (`jax_bridge`, the one module importing
jax)."""
