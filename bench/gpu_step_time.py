"""Device check (read-only: the GPU is opened unpinned, no clock or power limit is changed): on a real GPU,
does the loop's step time (median of steps 2-4, as fl_client.session times it) agree with the profile's
seconds_per_batch at the clock in force, within the session's 2x tolerance? And does a step with extra
host work inside (a copy to the host and back) stand out?"""

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from powerctl.devices import open_device
from powerctl.profiling.profiler import Profiler
from powerctl.records.workload import measure_workload

torch.manual_seed(0)
print("torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
dev = open_device("nvml:0", pin=False)
print("device", dev.spec, "pins", dev.pins, "frequencies", dev.frequencies(), flush=True)
net = torch.nn.Sequential(
    torch.nn.Conv2d(3, 64, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.Conv2d(64, 64, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(64, 10),
).cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)


def batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, 3, 32, 32, device="cuda"), torch.randint(0, 10, (b,), device="cuda")


def make_step(b: int, host_copy: bool = False) -> Callable[[], None]:
    x, y = batch(b)

    def step() -> None:
        opt.zero_grad()
        xs = x.cpu().cuda() if host_copy else x
        F.cross_entropy(net(xs), y).backward()
        opt.step()

    return step


x, y = batch(4)
workload = measure_workload(net, x, y, F.cross_entropy, "gpu-cnn")
sizes = [64, 256, 1024]
profile = Profiler(dev, workload, make_step, samples=8192, warmup_steps=3, measure_steps=10).run(
    sizes, order="grid", progress=False
)
hz = dev.frequencies()[0]
for b in sizes:
    point = profile.point(b, hz)
    assert point is not None, f"the grid profiled b={b} at {hz} Hz"
    for host_copy in (False, True):
        step = make_step(b, host_copy)
        times = []
        for _ in range(8):
            t0 = dev.clock()
            dev.run_step(step, batch_size=b, workload=workload)
            times.append(dev.clock() - t0)
        median = statistics.median(times[1:4])
        print(
            f"b={b:5d} host_copy={host_copy!s:5} profiled {point.seconds_per_batch * 1e3:8.3f} ms "
            f"loop median(2-4) {median * 1e3:8.3f} ms ratio {median / point.seconds_per_batch:6.2f} "
            f"peak {point.peak_power_w:.0f} W",
            flush=True,
        )
dev.close()
