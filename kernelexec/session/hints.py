"""One line added under an import error, saying how to get the module here (or why not).

A ``ModuleNotFoundError`` (and a profile's refusal of a module that is not the standard library, which an
install would allow) gets a line naming the way this server installs packages for a session
(``install_packages``, a ``%pip install`` line in a cell), or saying that installs are off in this
profile and why. The rules are the installer's own (``packages.check_allowed``); nothing is installed.
"""

from __future__ import annotations

import re
import sys

from kernelexec.config import Profile, Settings
from kernelexec.environment.packages import InstallError, check_allowed
from kernelexec.kernel.execution import CellError

_MISSING = re.compile(r"No module named '([^']+)'")
_REFUSED = re.compile(r"Import (?:of|from) (\S+) is not allowed in the '\w+' profile")  # startup/guard.py's words
# import names whose distribution is named otherwise (the common ones)
DISTRIBUTIONS = {
    "PIL": "pillow", "sklearn": "scikit-learn", "skimage": "scikit-image", "yaml": "pyyaml", "cv2": "opencv-python-headless",
    "bs4": "beautifulsoup4", "dateutil": "python-dateutil", "dotenv": "python-dotenv", "docx": "python-docx",
    "Crypto": "pycryptodome", "attr": "attrs", "jwt": "PyJWT", "serial": "pyserial",
}


def install_hint(settings: Settings, profile: Profile, error: CellError | None, *, local_kernel: bool) -> str | None:
    """The line for this error, or None when it is not about a module this server could install."""
    if error is None:
        return None
    missing = _MISSING.search(error.evalue) if error.ename == "ModuleNotFoundError" else None
    # the guard's refusal: ImportError, or ModuleNotFoundError when the module is not there either (guard.py)
    refused = _REFUSED.search(error.evalue) if error.ename in ("ImportError", "ModuleNotFoundError") else None
    found = missing or refused
    if found is None:
        return None
    name = found.group(1).partition(".")[0]
    if not name.isidentifier() or name in sys.stdlib_module_names:
        return None
    package = DISTRIBUTIONS.get(name, name)
    try:
        check_allowed(settings, profile, [package])
    except InstallError as exc:
        return None if refused else f"kernelexec: {package} cannot be installed here: {exc}"
    if not local_kernel:
        return None if refused else f"kernelexec: install {package} into the remote kernel's image (packages on demand need a local kernel)"
    ways = f"a line `%pip install {package}` in a cell"
    if settings.preset == "all":
        ways = f'the install_packages tool (packages=["{package}"]) or ' + ways
    if refused:
        return f"kernelexec: if {name} is a package, installing it here allows it: {ways}"
    return f"kernelexec: to install it here: {ways}; it is importable at once"
