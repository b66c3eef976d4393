"""The qemu harness, host side: root images and boots (boot), Debian's kernels
(kernels), the kernel x filesystem matrix and the reading of its results (matrix,
matrix_table), the arm64 guest (aarch64), the glibc 2.44 root (glibc_thp) and the boot
service's cost at boot (boot_cost). What runs inside the guests is in vm/guest/, copied
into the images by path (never imported from here)."""
