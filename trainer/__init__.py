"""pipeboard's engine: profiler, planner, schedules and simulator, runtime, model zoo.

Importable with no web stack; it never imports ``app``. Progress goes through a
``trainer.sink.Sink`` that the caller supplies.
"""
