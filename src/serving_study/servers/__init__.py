"""Starting and stopping servers.

Command lines and environments, CPU-quota cgroups, the local and container
runtimes, the host description, and reaping what a killed runner left behind.
"""
