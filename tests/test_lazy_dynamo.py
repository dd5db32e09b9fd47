"""trainer/core/lazy_dynamo.py: torchvision loads, and a model trains, without TorchDynamo (a `main.py` process that
compiles nothing starts seconds sooner), and whatever uses TorchDynamo still gets the real one, at that moment."""

import subprocess
import sys
import textwrap

from helpers import REPO

PROBE = textwrap.dedent("""
    import sys
    import trainer  # installs the stand-in, as every trainer process does
    import torch, torchvision
    from trainer.core import lazy_dynamo

    def said(what):
        print(what + ":", lazy_dynamo.loaded(), "sympy" in sys.modules)

    said("after torchvision")
    net = torchvision.models.resnet18(num_classes=3)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    import torch._dynamo
    plus_one = torch._dynamo.disable(lambda x: x + 1)  # TorchDynamo must never trace it, once it is loaded
    for _ in range(2):
        opt.zero_grad()
        net(torch.randn(2, 3, 32, 32)).sum().backward()
        opt.step()
    opt.load_state_dict(opt.state_dict())
    print("plus one:", plus_one(torch.ones(1)).item())
    said("after training steps")
    from torchvision.ops import roi_align
    ra = sys.modules["torchvision.ops.roi_align"]
    boxes = [torch.tensor([[0.0, 0.0, 4.0, 4.0]])]
    print("roi_align:", roi_align(torch.arange(64.0).reshape(1, 1, 8, 8), boxes, 2).flatten().tolist())
    print("asked:", ra.is_compile_supported("cpu"))
    said("then")
    import torch._dynamo.testing  # a submodule the package itself does not import
    from torch._dynamo.utils import counters
    print("real:", type(torch._dynamo).__name__, hasattr(torch._dynamo, "optimize"),
          torch._dynamo.testing.CompileCounter.__name__)
    print("compiled:", torch.compile(lambda x: plus_one(x) * 2)(torch.ones(2)).tolist(),
          "graph breaks:", sum(counters["graph_break"].values()))
""")


def test_torchvision_and_training_load_no_torchdynamo_and_compiling_gets_the_real_one():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines())
    assert lines["after torchvision"].split() == ["False", "False"], "neither TorchDynamo nor sympy loaded"
    assert lines["after training steps"].split() == ["False", "False"], "an optimizer's steps and state load neither"
    assert lines["plus one"].strip() == "2.0"
    assert [float(v) for v in lines["roi_align"].strip(" []").split(",")] == [9.0, 11.0, 25.0, 27.0]
    assert lines["asked"].strip() == "True" and lines["then"].split() == ["True", "True"], "loaded when asked"
    assert lines["real"].split() == ["module", "True", "CompileCounter"], "the real TorchDynamo, submodules and all"
    compiled, breaks = lines["compiled"].split("graph breaks:")
    assert compiled.strip() == "[4.0, 4.0]"
    assert int(breaks) >= 1, "a function disabled before TorchDynamo loaded is not traced after (TorchDynamo's own)"
