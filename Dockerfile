# One image for the whole fleet: `roundtrip run <service>` picks the service
# (gateway, model, guard, gate, executor, simulator, shop); `roundtrip topics create`
# creates the topics. Build: docker build -t roundtrip .

# -- build: a wheel of the package (no test extras) ------------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The build context is exactly what the wheel is built from (.dockerignore lets in only pyproject.toml, setup.py,
# README.md, services/ and schemas/: tests/wheel.py builds the wheel from the same files).
COPY . ./
RUN pip wheel --no-deps --wheel-dir /wheels .

# -- runtime ------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=build /wheels /wheels
# Agent packages installed with the fleet, named at build time (requirement specifiers your index serves):
#   docker build --build-arg AGENT_PACKAGES="acme-support==1.4.0" -t acme-fleet .
# or extend this image with a package of your own folder (docs/operating/deploy.md, "Your agent in the image"):
#   FROM roundtrip:latest / USER 0 / COPY . /src/agent / RUN pip install /src/agent / USER 10001
# The fleet's own distribution is roundtrip-fleet (the wheel here): an agent's dependency on it is met by it.
# The model on a cloud platform needs its client's extra (docs/operating/model-providers.md), e.g.
#   docker build --build-arg MODEL_EXTRAS=bedrock -t roundtrip .
ARG MODEL_EXTRAS=""
RUN if [ -n "${MODEL_EXTRAS}" ]; then pip install "$(echo /wheels/*.whl)[${MODEL_EXTRAS}]"; fi
ARG AGENT_PACKAGES=""
RUN pip install /wheels/*.whl ${AGENT_PACKAGES} && rm -rf /wheels

# Everything the fleet reads at run time is in the wheel: the demo agent's tool schemas (roundtrip/schemas/tools), the
# broker's pom.xml and log4j2.yaml, the migrations (tests/unit/test_wheel.py).
WORKDIR /app

RUN useradd --system --uid 10001 --gid 0 --home-dir /app --shell /usr/sbin/nologin roundtrip \
    && mkdir -p /var/lib/roundtrip \
    && chown 10001:0 /var/lib/roundtrip \
    && chmod 0770 /var/lib/roundtrip
# state_dir: SQLite files and span files when no database / OTLP endpoint is configured.
ENV ROUNDTRIP_STATE_DIR=/var/lib/roundtrip

USER 10001
CMD ["roundtrip", "--help"]
