"""pycoll's hook in torch's backend autoload (the ``torch.backends`` entry point, run by ``import
torch``): it registers the ``pycoll`` torch.distributed backend by name, so that
``init_process_group("pycoll")`` works without ``import pycoll.torch`` first; the backend's creator
imports :mod:`pycoll.torch` on first use. It imports nothing but torch.distributed (already
imported by torch) and never fails ``import torch``. Under an MPI launcher, ``import pycoll.torch``
before ``init_process_group`` still fills in torch's ``RANK``/``WORLD_SIZE`` from the launcher's
variables. ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns torch's autoload (this hook) off."""

from __future__ import annotations

from typing import Any


def create(*args: Any, **kwargs: Any) -> Any:
    """The backend's creator until :mod:`pycoll.torch` is imported: imports it and makes the group."""
    from pycoll.torch import create_process_group  # noqa: PLC0415 - on first use only

    return create_process_group(*args, **kwargs)


def register() -> None:
    """Register the ``pycoll`` backend (if torch.distributed is there and it is not registered yet)."""
    try:
        import torch.distributed as dist  # noqa: PLC0415 - torch calls this while it imports

        if dist.is_available() and "pycoll" not in dist.Backend.backend_list:
            dist.Backend.register_backend("pycoll", create, extended_api=True, devices=["cpu"])
    except Exception:  # noqa: BLE001 - a failure here must not fail ``import torch``
        pass
