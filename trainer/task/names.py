"""Names a task may use, without importing torch (the API's schemas and run configs read them)."""

OPTIMIZERS = ("adam", "adamw", "sgd")
