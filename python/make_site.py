"""Makes <build>/python/site: the package treeduce as an install would lay it out (the sources
linked, the built extension beside them), for PYTHONPATH in the build tree and the tests."""
import os
import sys

out, src, ext = sys.argv[1:4]
for d in ("treeduce", os.path.join("treeduce", "torch")):
    os.makedirs(os.path.join(out, d), exist_ok=True)
for rel in ("treeduce/__init__.py", "treeduce/torch/__init__.py", "treeduce/torch/hooks.py",
            "treeduce/" + os.path.basename(ext)):
    target = os.path.join(src, rel) if not rel.endswith(os.path.basename(ext)) else ext
    link = os.path.join(out, rel)
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(target), link)
