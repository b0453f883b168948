# nmt-serve image. Built in stages; the image is the last one:
#   python-base, requirements - Debian's python3; pyproject.toml's pins as requirement files
#   build   - CPU torch exports the committed checkpoint to an ONNX bundle (fp32 and int8), and
#             a separate virtualenv gets only the serving dependencies;
#   runtime - Debian's python3, that virtualenv and the bundle; no torch, no pip, no compilers.
#
# Build:  docker build -t nmt-serve .        (podman: see docs/deploy.md and deploy/container-test.sh)
# Run:    docker run -p 8000:8000 nmt-serve
ARG BASE_IMAGE=debian:bookworm-slim

# checkov:skip=CKV_DOCKER_7: the tag is BASE_IMAGE's, pinned above (bookworm-slim, not latest)
FROM ${BASE_IMAGE} AS python-base

# Debian's python3 is the one the runtime stage has: the virtualenvs made here run there as is.
# Versions come from the base image's Debian release; exact revisions would break the build on
# every Debian security update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*


# pyproject.toml's pins as requirement files, in a stage of their own: the build stage copies
# only these, so an edit elsewhere in pyproject.toml does not reinstall torch.
FROM python-base AS requirements
COPY pyproject.toml /src/
# The serving install includes the `postgres` extra: one image serves SQLite and PostgreSQL.
RUN python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
        serve = p["dependencies"] + p["optional-dependencies"]["postgres"]; \
        print("\n".join(serve), file=open("/src/serve.txt", "w")); \
        print("\n".join(p["optional-dependencies"]["export"]), file=open("/src/export.txt", "w"))'


FROM python-base AS build

# Behind a corporate proxy: a pip index, extra indexes, local wheel folders and a CA bundle,
# each a path or URL the build can see (podman/buildah: mount them with `-v`). Empty values,
# the default, are ignored by pip; none of them reaches the runtime stage.
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
ARG PIP_FIND_LINKS=""
ARG PIP_CERT=""
# The export needs torch, and plain `torch` from PyPI is the multi-GB CUDA build; PyTorch's CPU
# index serves the CPU one. Empty when PIP_FIND_LINKS already holds a CPU wheel.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Dependencies first, so that a code change reuses these layers. The runtime virtualenv gets no
# pip of its own: the export venv's pip installs into it.
COPY --from=requirements /src/serve.txt /src/export.txt /requirements/
RUN python3 -m venv /opt/export-venv \
    && /opt/export-venv/bin/pip install --no-cache-dir \
        ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        -r /requirements/serve.txt -r /requirements/export.txt \
    && python3 -m venv --without-pip /opt/venv \
    && /opt/export-venv/bin/pip --python /opt/venv/bin/python install --no-cache-dir \
        -r /requirements/serve.txt

WORKDIR /src
COPY pyproject.toml README.md ./
# Top-level modules (the CLI and what the exporter and the runtime share), then the packages.
COPY *.py ./
COPY service ./service
COPY export ./export
COPY models/fr-en ./models/fr-en

# One wheel of the project for both virtualenvs, then the bundle. The runtime user only reads it.
# The packages' own test suites (18 MB) never run in the image.
RUN /opt/export-venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheel . \
    && /opt/export-venv/bin/pip install --no-cache-dir --no-deps /tmp/wheel/*.whl \
    && /opt/export-venv/bin/pip --python /opt/venv/bin/python install --no-cache-dir --no-deps \
        /tmp/wheel/*.whl \
    && find /opt/venv/lib/python3.11/site-packages -depth -type d -name tests -exec rm -rf {} + \
    && /opt/export-venv/bin/nmt export --checkpoint models/fr-en --out /opt/nmt/models/fr-en \
        --int8 \
    && chmod -R a+rX,go-w /opt/nmt /opt/venv


FROM ${BASE_IMAGE} AS runtime

# Same Debian python3 as the build stage (the copied virtualenv links to /usr/bin/python3).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nmt \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/nmt

COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/nmt/models /opt/nmt/models

# Settings are NMT_* variables (README, Settings); override any of them with `-e`. Nothing is
# written at run time except under /tmp and the data volume, so the container runs with a
# read-only root.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    NMT_MODEL_DIR=/opt/nmt/models \
    NMT_STATE_DIR=/var/lib/nmt \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=8000

# The SQLite database (nmt.db) when NMT_DATABASE_URL is empty: a volume, owned by the runtime
# user (a new named volume takes this folder's owner), so glossaries outlive the container.
VOLUME ["/var/lib/nmt"]

# A numeric user, so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000

# Ready, not only alive: /readyz answers 200 once every model is loaded and warmed up, and 503
# while draining after SIGTERM. The image has no curl; python3 is there anyway.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('NMT_PORT', '8000'), timeout=4)"]

# `nmt` is the entry point so that other subcommands run too (`docker run IMAGE translate ...`).
ENTRYPOINT ["nmt"]
CMD ["serve", "--host", "0.0.0.0"]

# Last, so that a new revision changes only the metadata and reuses every layer above.
ARG VERSION=dev
ARG REVISION=unknown
ARG SOURCE=""
LABEL org.opencontainers.image.title="nmt-serve" \
      org.opencontainers.image.description="French->English neural machine translation over HTTP (ONNX Runtime, FastAPI)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
