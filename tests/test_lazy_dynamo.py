"""trainer/core/lazy_dynamo.py: torchvision loads without TorchDynamo (a `main.py` process that compiles nothing
starts ~2.5 s sooner), and whatever uses TorchDynamo still gets the real one."""

import subprocess
import sys
import textwrap

from helpers import REPO

PROBE = textwrap.dedent("""
    import sys
    import trainer  # installs the stand-in, as every trainer process does
    import torch, torchvision
    print("after torchvision:", "torch._dynamo" in sys.modules, "sympy" in sys.modules)
    from torchvision.ops import roi_align
    ra = sys.modules["torchvision.ops.roi_align"]
    boxes = [torch.tensor([[0.0, 0.0, 4.0, 4.0]])]
    image = torch.arange(64.0).reshape(1, 1, 8, 8)
    print("roi_align:", roi_align(image, boxes, 2).flatten().tolist())
    print("asked:", ra.is_compile_supported("cpu"), "then loaded:", "torch._dynamo" in sys.modules)
    import torch._dynamo
    print("real:", hasattr(torch._dynamo, "optimize"), torch.compile(lambda x: x * 2)(torch.ones(2)).tolist())
""")


def test_torchvision_loads_without_torchdynamo_and_compiling_still_gets_it():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert lines["after torchvision"].split() == ["False", "False"], "neither TorchDynamo nor sympy loaded"
    assert [float(v) for v in lines["roi_align"].strip(" []").split(",")] == [9.0, 11.0, 25.0, 27.0]
    assert lines["asked"].split() == ["True", "then", "loaded:", "True"], "the real answer, loaded when asked"
    assert lines["real"].split() == ["True", "[2.0,", "2.0]"], "torch.compile works with the real TorchDynamo"
