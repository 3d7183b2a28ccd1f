# pipeboard image: API, worker and CLI in one (the command chooses the role).
# Build:  docker compose build        GPU worker image: docker compose --profile gpu build
FROM python:3.11-slim

# Where torch comes from: empty = the default index (its Linux wheels bundle CUDA, as the GPU
# worker needs); pass PyTorch's CPU-only wheel index instead for a much smaller CPU image.
ARG TORCH_INDEX_URL=""

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIPEBOARD_DATA_DIR=/data

WORKDIR /srv/pipeboard

# Dependencies first, so that code changes do not reinstall torch.
COPY constraints.txt ./
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0

COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY trainer ./trainer
COPY frontend ./frontend
COPY migrations ./migrations
COPY bench ./bench
# Editable: the service finds alembic.ini, migrations/ and frontend/ beside its code.
RUN pip install -c constraints.txt -e . && mkdir -p /data

EXPOSE 8000
VOLUME ["/data"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/api/v1/health', timeout=4)" || exit 1

CMD ["pipeboard", "up", "--host", "0.0.0.0", "--port", "8000"]
