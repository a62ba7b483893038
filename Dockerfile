# Lattice scheduler and node agent image: runtime dependencies only, non-root.
#
# BASE is any Debian bookworm image with python3.11 and its venv module. With a
# registry, the default (the official slim image) is pulled; `just image` builds
# without one, from a local mmdebstrap of Debian bookworm with Debian's python3.11
# (lattice_dev/devcluster/image.py). Everything lives in a virtualenv under /opt,
# so Debian's externally-managed python and the official image behave the same.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
# strip (binutils), for this stage only: many wheels ship unstripped shared objects.
RUN command -v strip >/dev/null || { apt-get update -q \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends binutils; }
RUN python3 -m venv /opt/lattice
# The dependencies first, from pyproject.toml alone, in a layer of their own: a change to
# scheduler/ (nearly every build) then reuses it. [project].dependencies only, never
# the extras; as wheels, so pip's cache stays in this stage.
COPY pyproject.toml ./
RUN /opt/lattice/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
    && /opt/lattice/bin/pip wheel --disable-pip-version-check --wheel-dir /wheels -r /tmp/requirements.txt \
    && /opt/lattice/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
        --find-links /wheels -r /tmp/requirements.txt \
    && /opt/lattice/bin/pip uninstall --yes --disable-pip-version-check setuptools \
    && rm -rf /wheels \
    # Never imported at run time: test suites, bytecode (the root is read-only, so
    # it is compiled below once), type stubs, C headers.
    && site="$(/opt/lattice/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && find "$site" -depth \( -name tests -o -name __pycache__ \) -type d \
        -path "*/site-packages/*/*" -exec rm -rf {} + \
    && find "$site" \( -name '*.pyi' -o -name '*.h' -o -name '*.pxd' \) -delete \
    # Python subpackages of dependencies that nothing here imports (an image's
    # sys.modules after every command and a CP-SAT solve): ortools' other solvers'
    # wrappers (math_opt, linear_solver, constraint_solver/routing, graph, pdlp, ...;
    # Lattice uses CP-SAT only: ortools.sat and its ortools.util; the native
    # ortools/.libs stay, libortools links them all) and numpy's build tools.
    && for sub in "$site"/ortools/*/; do \
        case "$(basename "$sub")" in sat|util) ;; *) rm -rf "$sub" ;; esac; \
    done \
    && rm -rf "$site/numpy/f2py" "$site/numpy/distutils" /opt/lattice/bin/f2py \
    # Symbols and debug sections of shared objects are never loaded. Not the libraries
    # auditwheel vendored into site-packages/<name>.libs/: patchelf rewrote their
    # program headers, and stripped they are refused by the loader (not page-aligned);
    # then every shared object must still load.
    && find "$site" -type f -name '*.so*' -not -regex '.*/site-packages/[^/]*\.libs/.*' \
        -exec strip --strip-unneeded {} + \
    && /opt/lattice/bin/python -c 'import ctypes, pathlib, sys; \
[ctypes.CDLL(str(p)) for p in pathlib.Path(sys.argv[1]).rglob("*.so*") if p.is_file()]' "$site" \
    && /opt/lattice/bin/python -m compileall -q -j 0 "$site" \
    # What the trimming and stripping above must leave working: every native wheel.
    && /opt/lattice/bin/python -c 'import numpy, pandas, orjson, yaml, aiohttp, cel_expr_python; \
from ortools.sat.python import cp_model as c; m = c.CpModel(); m.maximize(m.new_int_var(0, 3, "x")); \
assert c.CpSolver().solve(m) == c.OPTIMAL; numpy.linalg.inv(numpy.eye(2))'
# Then the package itself, on the installed dependencies.
COPY README.md ./
COPY scheduler ./scheduler
RUN /opt/lattice/bin/pip install --disable-pip-version-check --no-deps . \
    && /opt/lattice/bin/pip check \
    && /opt/lattice/bin/pip uninstall --yes --disable-pip-version-check pip \
    && site="$(/opt/lattice/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    && find "$site/scheduler" -depth -name __pycache__ -type d -exec rm -rf {} + \
    && /opt/lattice/bin/python -m compileall -q -j 0 "$site/scheduler" \
    && /opt/lattice/bin/lattice --version

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/lattice/bin:/usr/local/bin:/usr/bin:/bin
# A passwd entry for uid 65532 without useradd (not in every minimal base).
RUN echo 'lattice:x:65532:65532:lattice:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'lattice:x:65532:' >> /etc/group
COPY --from=build /opt/lattice /opt/lattice
RUN lattice --version
USER 65532:65532
ENTRYPOINT ["lattice"]
CMD ["--help"]
