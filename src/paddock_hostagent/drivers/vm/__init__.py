"""The VM tier: QEMU, its QMP monitor, the guest channel and the VM's boot image."""
