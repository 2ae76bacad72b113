"""Stand-in for `matplotlib.colors`, found only where the real package is not installed.

gymnax imports matplotlib and seaborn at module level but uses them only to render
environments, which the benchmark never does. Any use fails with a clear error.
"""


def __getattr__(name):
    raise AttributeError(
        f"matplotlib.colors.{name}: this is a stand-in for rendering, which needs the real "
        "package installed"
    )
