"""A PEP 517 build backend for the pure-Python deltabox package, standard library only, so
that installing the SDK needs no package index (no setuptools, no wheel package).

It builds a py3-none-any wheel of the deltabox/ directory (and an sdist of the tree); it
knows nothing beyond this package.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "deltabox"
VERSION = "0.1.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: Python SDK of DeltaBox: sandboxes for AI agents with millisecond checkpoints and rollback
Requires-Python: >=3.9
"""
WHEEL = """Wheel-Version: 1.0
Generator: deltabox_build
Root-Is-Purelib: true
Tag: py3-none-any
"""


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def _package_files():
    pkg = os.path.join(ROOT, NAME)
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith((".py", ".typed")):
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files):
    distinfo = f"{NAME}-{VERSION}.dist-info"
    wheel_name = f"{NAME}-{VERSION}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as zf:
        entries = list(files) + [(f"{distinfo}/METADATA", METADATA.encode()), (f"{distinfo}/WHEEL", WHEEL.encode())]
        for name, data in entries:
            zf.writestr(name, data)
            records.append(_record_line(name, data))
        records.append(f"{distinfo}/RECORD,,")
        zf.writestr(f"{distinfo}/RECORD", "\n".join(records) + "\n")
    return wheel_name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for full, rel in _package_files():
        with open(full, "rb") as f:
            files.append((rel, f.read()))
    return _write_wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file putting the source tree on sys.path.
    return _write_wheel(wheel_directory, [(f"{NAME}.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as tf:
        for rel in ["pyproject.toml", "_build/deltabox_build.py"] + [r for _, r in _package_files()]:
            tf.add(os.path.join(ROOT, rel), arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = METADATA.encode()
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return name
