"""The array IR: op registry, core objects, text form, builder, executors."""
