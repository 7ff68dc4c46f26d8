# The gateway itself as an image, for cluster mode (deploy/stack.yml): a node gateway
# on every machine driving that machine's Docker engine, and the routers.
#
# It is built on the kernel image, so a node that has one holds most of the other
# (shared layers), and Debian's Python is already there. The gateway gets a venv of
# its own (/opt/gateway): the kernels' locked libraries in /opt/venv stay untouched.
# `kernel-gateway build-image --gateway` brings the wheels (the gateway's own, built
# from the checkout, and what the gateway process needs of the server extra: not the
# kernels' numpy, pandas, matplotlib..., which live in the kernel containers) in
# gateway-wheels/, and their list in gateway-requirements.txt.
ARG KERNEL_IMAGE=kernel-gateway-kernel:latest
FROM ${KERNEL_IMAGE} AS venv
USER root
COPY gateway-requirements.txt /build/
COPY gateway-wheels/ /build/wheels/
RUN set -e; python3 -m venv --without-pip /opt/gateway; \
    pip="/opt/venv/bin/pip --python /opt/gateway/bin/python --disable-pip-version-check"; \
    $pip install --no-cache-dir --progress-bar off --no-index --find-links /build/wheels \
        -r /build/gateway-requirements.txt httpx; \
    $pip install --no-cache-dir --progress-bar off --no-index --no-deps \
        /build/wheels/kernel_gateway-*.whl; \
    rm -rf /build

# The wheels stay in the build stage: only the venv reaches the image.
FROM ${KERNEL_IMAGE}
USER root
COPY --from=venv /opt/gateway /opt/gateway
ENV PATH=/opt/gateway/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VIRTUAL_ENV=/opt/gateway \
    HOME=/root \
    MPLBACKEND=agg
WORKDIR /
ENTRYPOINT ["kernel-gateway"]
CMD ["serve"]
