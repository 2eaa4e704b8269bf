# syntax=docker/dockerfile:1
# corral container image: a release build in a Rust builder stage, run as a non-root user on
# a slim Debian base. Defaults expect the upstream Redis at redis:6379 (see docker-compose.yml);
# pass other flags as the container command to change them.

FROM rust:1-slim-bookworm AS build
WORKDIR /build
COPY . .
# Cache mounts keep the crate registry and build directory between builds; the binary is
# copied out in the same step because the target directory is not part of the image layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/build/target \
    cargo build --release --locked --bin corral \
    && cp target/release/corral /usr/local/bin/corral

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 corral \
    && useradd --system --uid 10001 --gid corral --no-create-home --shell /usr/sbin/nologin corral
COPY --from=build /usr/local/bin/corral /usr/local/bin/corral
COPY conf/corral.toml /etc/corral/corral.toml
USER corral
# No MIMALLOC_ALLOW_THP=0 here: it would turn transparent huge pages off for the whole process,
# the cache's tables too. corral keeps its heap off them itself on a host where they are
# `always` on (README, "No transparent huge pages for the heap").
EXPOSE 6380 9121
# The image has no curl: bash's /dev/tcp sends the request, and /healthz answers 200 only
# while at least one upstream connection is up.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9121 && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
# corral shuts down gracefully on SIGTERM (the default stop signal), so it can run as PID 1.
ENTRYPOINT ["/usr/local/bin/corral"]
CMD ["--config", "/etc/corral/corral.toml", "--listen", "0.0.0.0:6380", "--admin", "0.0.0.0:9121", "--upstream", "redis://redis:6379"]
