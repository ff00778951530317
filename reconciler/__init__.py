"""nftrec: kube-proxy's nftables mode without Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("nftrec")
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0+checkout"
