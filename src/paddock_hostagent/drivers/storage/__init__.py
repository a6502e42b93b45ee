"""Sandbox disks and trees: root disk images, loop devices, mounts, S3 disks, safe paths."""
