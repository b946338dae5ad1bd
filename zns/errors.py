"""The public name of zns's error tree; it lives in `zns.core.errors`."""

from zns.core.errors import *  # noqa: F401,F403
from zns.core.errors import __all__  # noqa: F401
