"""pipeboard's service: FastAPI API, SQL models, Celery worker and the `pipeboard` command line."""
