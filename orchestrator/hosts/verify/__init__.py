"""Host verification: testinfra tests shipped with the package, run through its Ansible backend."""
