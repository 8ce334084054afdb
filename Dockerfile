# syntax=docker/dockerfile:1
#
# The ledger's stages as an image, built from the wheel.
#
#   docker build -t kafka-recovery-ledger .                 # the stages (default target)
#   docker build -t kafka-recovery-ledger-sink --target sink .   # + the testbed's reference sink
#   docker run --rm kafka-recovery-ledger relay             # one stage per container
#
# The entry point is the `ledger` console script; the command names the stage
# (processor, authority, relay) or any other `ledger` command (`topics create`,
# `reconcile run`). Without one it prints the commands and exits. Settings come
# from the environment (LEDGER_*, see docs/configuration.md). The production target holds
# the console, OTLP and postgres extras and no testbed; the `sink` target adds the
# testbed (its own wheel, kafka-recovery-ledger-testbed) for the reference sink only.
# Not built in CI (no container engine there); see docs/deploying.md.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---------------------------------------------------------------- build the wheel
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir "build>=1.2"
COPY pyproject.toml README.md ./
COPY ledger ledger
COPY consumers consumers
COPY producers producers
COPY sinks sinks
COPY schemas schemas
COPY testbed testbed
RUN python -m build --wheel --outdir /wheels \
    && python -m build --wheel --outdir /wheels ./testbed

# ---------------------------------------------------------------- common runtime
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LEDGER_HOME=/var/lib/ledger \
    LEDGER_RUN_DIR=/var/lib/ledger \
    LEDGER_KEYS_DIR=/var/lib/ledger/keys
# A fixed non-root user; the run folder (and a named volume mounted on it)
# belongs to it, the keys folder is its alone.
RUN groupadd --system --gid 10001 ledger \
    && useradd --system --uid 10001 --gid ledger --home-dir /var/lib/ledger --no-create-home \
       --shell /usr/sbin/nologin ledger \
    && mkdir -p /var/lib/ledger/keys \
    && chown -R ledger:ledger /var/lib/ledger \
    && chmod 0700 /var/lib/ledger/keys
WORKDIR /var/lib/ledger

# ---------------------------------------------------------------- reference sink (testbed)
FROM runtime AS sink
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/kafka_recovery_ledger-*.whl \
        /wheels/kafka_recovery_ledger_testbed-*.whl
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["ledger"]
CMD ["sink", "serve", "payments", "--port", "8080"]

# ---------------------------------------------------------------- the stages (default)
FROM runtime AS stages
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir "$(ls /wheels/kafka_recovery_ledger-*.whl)[console,otlp,postgres]"
USER 10001:10001
ENTRYPOINT ["ledger"]
CMD ["--help"]
