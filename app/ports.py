"""Whether the app can listen where it was asked to: checked before anything heavy is imported or loaded, so that
``mdc app --port N`` on a port in use says so at once (this module imports neither gradio nor torch)."""

from __future__ import annotations

import errno
import socket


def port_message(host: str, port: int | None) -> str:
    where = f"port {port} on {host} is" if port else f"every port gradio tries from 7860 on {host} is"
    return f"{where} in use (another app or server runs there); stop it or pass --port with a free port"


def check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a listener blocks, TIME_WAIT not
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ValueError(port_message(host, port)) from None
            raise ValueError(f"cannot serve on {host}:{port}: {err.strerror}") from None
