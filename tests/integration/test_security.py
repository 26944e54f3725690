"""What docs/security.md promises and a test can check on the real stack."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hookwatch.tools.devstack import Stack

pytestmark = pytest.mark.integration


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir() if fd_dir.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _listening(inodes: set[str]) -> list[str]:
    """``address:port`` of every listening TCP socket among ``inodes`` (IPv4 and IPv6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            address, port = local.split(":")
            found.append(f"{_address(address, width)}:{int(port, 16)}")
    return found


def _address(hex_address: str, width: int) -> str:
    if width == 8:
        return ".".join(str(int(hex_address[i : i + 2], 16)) for i in (6, 4, 2, 0))
    words = [hex_address[i : i + 8] for i in range(0, 32, 8)]
    # Each 32-bit word is little-endian: ::1 is 00000000 00000000 00000000 01000000.
    address = ipaddress.IPv6Address(
        bytes.fromhex("".join(w[6:8] + w[4:6] + w[2:4] + w[0:2] for w in words))
    )
    # Java listens on IPv4 addresses through IPv4-mapped IPv6 sockets.
    return str(address.ipv4_mapped or address)


def _descendants(pid: int) -> set[int]:
    """``pid`` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, []))
    return found


def test_the_native_stack_listens_on_loopback_only(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack("bind", workers=1)
    stack.start_torchserve()
    stack.start_exporter()
    stack.start_prometheus()
    pids = set()
    for pid in stack.recorded_pids().values():
        pids |= _descendants(pid)
    inodes = set().union(*(_socket_inodes(p) for p in pids))
    listening = _listening(inodes)
    # TorchServe's inference, management and metrics APIs, its gRPC ports, the exporter,
    # Prometheus, and the worker's own socket to the frontend: all of them loopback.
    assert len(listening) >= 6, listening
    wide = [a for a in listening if not ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback]
    assert wide == [], listening


def test_with_token_auth_a_client_passes_the_inference_key(
    make_stack: Callable[..., Stack],
) -> None:
    """docs/security.md's recipe for a port reachable beyond loopback: TorchServe's token
    authorisation on, the key read from key_file.json, sent as a bearer token."""
    import json

    from hookwatch.tools.demo.data import load_split
    from hookwatch.tools.devstack import http_post

    stack = make_stack("token", workers=1, token_auth=True)
    stack.start_torchserve()
    url = f"http://127.0.0.1:{stack.ports.inference}/predictions/{stack.model_name}"
    body = json.dumps({"data": load_split().x_test[0].tolist()}).encode()

    def refused(headers: dict[str, str]) -> bool:
        # TorchServe 0.12 answers a missing or wrong key with 400 InvalidKeyException.
        status, reply = http_post(url, body, headers=headers)
        return status == 400 and b"InvalidKeyException" in reply

    assert refused({})
    assert refused({"Authorization": "Bearer not-the-key"})
    # The management key does not open the inference API.
    assert refused(stack.api_key("management"))
    status, reply = http_post(url, body, headers=stack.api_key("inference"))
    assert status == 200 and "class" in json.loads(reply), reply
