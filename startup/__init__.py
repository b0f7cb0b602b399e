"""Code that runs inside each kernel process before any user code (stdlib only).

The server never imports these modules; it passes their directory to ipykernel as
``--IPKernelApp.exec_files=<dir>/kernel_init.py``.
"""
