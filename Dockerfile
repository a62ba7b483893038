# Lattice scheduler and node agent image: slim, pinned, runtime dependencies only, non-root.
#
# The build stage turns the package and its [project].dependencies (never the dev
# extras) into wheels; the final stage installs exactly those from the local folder,
# with no index, so what runs is what pyproject.toml declares.
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduler ./scheduler
RUN pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --system --uid 65532 --no-create-home --shell /usr/sbin/nologin lattice
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels lattice-scheduler \
    && rm -rf /wheels \
    && pip check \
    && lattice --version
USER 65532:65532
ENTRYPOINT ["lattice"]
CMD ["--help"]
