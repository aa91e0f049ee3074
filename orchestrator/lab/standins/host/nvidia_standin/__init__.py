"""Stand-in for the NVIDIA driver on lab hosts: a GPU config, a registry of GPU memory holders.

Installed into a lab host's dist-packages; standard library only (the hosts have no pip).
"""
