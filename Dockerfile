# kvlink-rag service image: the API (`kvlink-rag serve`) and the precompute worker (`kvlink-rag worker`).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KVLINK_RAG_HOME=/data

WORKDIR /app
# CPU build of torch first (the default index would pull the CUDA build); any torch >= 2.3 works.
RUN pip install "torch>=2.3" --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY kvlink_rag ./kvlink_rag
COPY store ./store
COPY service ./service
COPY api ./api
COPY workers ./workers
COPY training ./training
COPY evaluation ./evaluation
COPY cli ./cli
# /data/store and /data/models exist in the image so that new named volumes inherit their owner.
RUN pip install . && useradd --create-home --uid 1000 kvlink \
    && mkdir -p /data/store /data/models && chown -R kvlink /data
USER kvlink
EXPOSE 8000
CMD ["kvlink-rag", "serve", "--host", "0.0.0.0", "--port", "8000"]
