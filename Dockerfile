# lcm-proxy container image.
#
#   docker build -t lcm-proxy .
#   docker run --rm -p 127.0.0.1:4000:4000 -v lcm-data:/data lcm-proxy
#
# Mount your own config over /etc/lcm-proxy/proxy.yaml. Conversations and stored files live under
# /data/lcm-proxy (the default data_dir resolves to $XDG_DATA_HOME/lcm-proxy).

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Unprivileged user with a fixed uid, so that bind-mounted data directories can be chowned to match.
RUN groupadd --system --gid 10001 lcm \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/lcm --create-home --shell /usr/sbin/nologin lcm

# Install the package (not editable) and drop the build tree afterwards. README.md is needed because
# pyproject.toml declares it as the package's readme.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
RUN pip install '.[postgres]' \
 && cd / && rm -rf /src

COPY config/proxy.yaml /etc/lcm-proxy/proxy.yaml

RUN mkdir -p /data \
 && chown 10001:10001 /data \
 && chmod 0700 /data

ENV XDG_DATA_HOME=/data \
    LCM_PROXY_CONFIG=/etc/lcm-proxy/proxy.yaml \
    LITELLM_LOCAL_MODEL_COST_MAP=True

VOLUME ["/data"]
WORKDIR /home/lcm
USER 10001:10001

EXPOSE 4000

# No curl in the slim image; python's urllib raises (non-zero exit) on connection errors and non-2xx.
# If you change the port, change it here too.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:4000/healthz', timeout=4)"]

# Security: the proxy binds 0.0.0.0 here so that published ports work. Without general_settings.api_keys,
# anyone who can reach a published port can spend your upstream keys; the container is only reachable
# through ports you publish (prefer -p 127.0.0.1:4000:4000), but set api_keys in your config anyway.
# Without keys it answers only Host names a web page cannot rebind to it (IP addresses, localhost, the
# container's hostname): list any other name clients use (a compose service name) in
# general_settings.allowed_hosts.
CMD ["lcm-proxy", "serve", "--config", "/etc/lcm-proxy/proxy.yaml", "--host", "0.0.0.0"]
