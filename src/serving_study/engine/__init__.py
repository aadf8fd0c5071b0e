"""The embedded engine: SGLang's request path, minus the model, on any Linux host."""
