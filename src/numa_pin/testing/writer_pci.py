"""Writes a spec's PCI functions the way the kernel lays them out in sysfs.

Functions live under ``devices/pci<domain>:<bus>/`` (nested below their upstream bridge),
with ``bus/pci/devices`` links, drivers, IOMMU groups, SR-IOV ``virtfnN``/``physfn`` links,
network interfaces under ``net/`` and ``/sys/class/net``, the binary ``config`` space, and
the NVIDIA driver's ``/proc/driver/nvidia`` files for GPUs that carry a UUID.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from numa_pin.testing.files import TreeFiles
from numa_pin.testing.kernel_text import kernel_mask, list_line, nvidia_information
from numa_pin.testing.pci_spec import VFIO_GROUP_MAJOR, VIRTUAL_DEV_NODES, PciSpec, VfSpec, addr_parts, dev_node_parts
from numa_pin.testing.spec import MachineSpec


class PciWriter:
    """Writes the PCI part of one machine; owns the ifindex counter and function dirs."""

    def __init__(
        self, spec: MachineSpec, files: TreeFiles, sys_root: Path, proc_root: Path
    ) -> None:
        self.spec = spec
        self.files = files
        self.sys = sys_root
        self.proc = proc_root
        self.nbits = spec.cpu_count  # nr_cpu_ids: every possible CPU
        self.devices_dir = sys_root / "devices"
        self.groups = spec.iommu_groups()
        self._next_ifindex = 2  # 1 is lo
        self.pci_dirs: dict[str, Path] = {}

    def write_all(self) -> None:
        self.write_net_loopback()
        self.write_pci()

    def write_pci(self) -> None:
        spec = self.spec
        by_addr = spec.pci_by_address()
        self.files.write(self.sys / "bus" / "pci" / "drivers_autoprobe", "1\n")
        self.files.mkdir(self.sys / "bus" / "pci" / "devices")
        self.files.mkdir(self.sys / "bus" / "pci" / "drivers")
        self.files.mkdir(self.sys / "kernel" / "iommu_groups")
        for dev in sorted(spec.pci, key=lambda p: self._depth(p, by_addr)):
            self.pci_dirs[dev.address] = self._dir_for(dev, by_addr)
        acpi_bus = self.devices_dir / "LNXSYSTM:00" / "LNXSYBUS:00"
        for index, (domain, bus) in enumerate(
            sorted({self._root_of(p, by_addr) for p in spec.pci})
        ):
            host = self.devices_dir / f"pci{domain:04x}:{bus:02x}"
            acpi = acpi_bus / f"PNP0A08:{index:02x}"  # the ACPI host bridge of this root bus
            self.files.write(host / "uevent", "")
            self.files.write(acpi / "uevent", "")
            self.files.write(acpi / "path", f"\\_SB_.PC{index:02X}\n")
            self.files.link(host / "firmware_node", acpi)
            self.files.link(acpi / "physical_node", host)
        for dev in spec.pci:
            self._write_function(dev, by_addr)
            for index, vf in enumerate(dev.vfs):
                self._write_vf(dev, index, vf)
        for dev in spec.pci:
            if dev.gpu_uuid is not None:
                self._write_nvidia(dev)
        vfio = sorted({self.groups[a] for a, driver in self._drivers() if driver == "vfio-pci" and a in self.groups})
        if vfio or any(dev.dev_nodes for dev in spec.pci):
            for node in VIRTUAL_DEV_NODES:
                self._dev_node(self.devices_dir / "virtual", node)
            for dev in spec.pci:
                for node in dev.dev_nodes:
                    self._dev_node(self.pci_dirs[dev.address], node)
            for group in vfio:  # the VFIO group's character device (/dev/vfio/<group>)
                self._dev_node(self.devices_dir / "virtual", f"vfio/{group}={VFIO_GROUP_MAJOR}:{group}")

    def _drivers(self) -> list[tuple[str, str | None]]:
        """``(address, driver)`` of every function, VFs included."""
        out = []
        for dev in self.spec.pci:
            out.append((dev.address, dev.driver))
            out.extend((vf.address, vf.driver) for vf in dev.vfs)
        return out

    def _dev_node(self, parent: Path, node: str) -> None:
        """``<parent>/<class>/<name>/dev``, its ``/sys/dev/char/<major>:<minor>`` link and its
        ``/sys/class/<class>/<name>`` link."""
        cls, name, numbers = dev_node_parts(node)
        d = parent / cls / name
        self.files.write(d / "dev", numbers + "\n")
        major, minor = numbers.split(":")
        self.files.write(d / "uevent", f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\n")
        self.files.link(self.sys / "dev" / "char" / numbers, d)
        self.files.link(self.sys / "class" / cls / name, d)

    def _depth(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> int:
        depth = 0
        while dev.parent is not None:
            dev = by_addr[dev.parent]
            depth += 1
        return depth

    def _root_of(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> tuple[int, int]:
        while dev.parent is not None:
            dev = by_addr[dev.parent]
        return (dev.domain, dev.bus)

    def _dir_for(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> Path:
        if dev.parent is None:
            return self.devices_dir / f"pci{dev.domain:04x}:{dev.bus:02x}" / dev.address
        return self.pci_dirs[dev.parent] / dev.address

    def _bridge_buses(self, dev: PciSpec) -> tuple[int, int]:
        """(secondary, subordinate) bus numbers of a bridge, from what sits below it."""
        below: list[int] = []
        direct: list[int] = []
        for other in self.spec.pci:
            if other.parent == dev.address:
                direct.append(other.bus)
        todo = [dev.address]
        while todo:
            cur = todo.pop()
            for other in self.spec.pci:
                if other.parent == cur:
                    below.append(other.bus)
                    below.extend(addr_parts(vf.address)[1] for vf in other.vfs)
                    todo.append(other.address)
        if not direct:
            return (dev.bus + 1, dev.bus + 1)
        return (min(direct), max(below))

    def _write_function(self, dev: PciSpec, by_addr: Mapping[str, PciSpec]) -> None:
        d = self.pci_dirs[dev.address]
        local = self.spec.pci_local_cpus(dev)
        self._common_files(
            d,
            dev.address,
            dev.vendor,
            dev.device,
            dev.pci_class,
            dev.numa_node,
            local,
            dev.driver,
            dev,
        )
        if dev.sriov_totalvfs is not None:
            self.files.write(d / "sriov_totalvfs", f"{dev.sriov_totalvfs}\n")
            self.files.write(d / "sriov_numvfs", f"{dev.numvfs}\n")
            self.files.write(d / "sriov_offset", "16\n")
            self.files.write(d / "sriov_stride", "1\n")
            self.files.write(d / "sriov_vf_device", f"{(dev.vf_device or dev.device)[2:]}\n")
            self.files.write(d / "sriov_drivers_autoprobe", "1\n")
        for name in dev.netdevs:
            self._netdev(d, name)
        self._iommu(d, dev.address, self.groups.get(dev.address))

    def _write_vf(self, pf: PciSpec, index: int, vf: VfSpec) -> None:
        pf_dir = self.pci_dirs[pf.address]
        d = pf_dir.parent / vf.address
        self.pci_dirs[vf.address] = d
        vf_spec = PciSpec(
            address=vf.address,
            vendor=pf.vendor,
            device=pf.vf_device or pf.device,
            pci_class=pf.pci_class,
            numa_node=pf.numa_node,
            subsystem_vendor=pf.subsystem_vendor,
            subsystem_device=pf.subsystem_device,
            revision=pf.revision,
            link_speed=pf.link_speed,
            link_width=pf.link_width,
        )
        self._common_files(
            d,
            vf.address,
            vf_spec.vendor,
            vf_spec.device,
            pf.pci_class,
            pf.numa_node,
            self.spec.pci_local_cpus(pf),
            vf.driver,
            vf_spec,
        )
        self.files.link(d / "physfn", pf_dir)
        self.files.link(pf_dir / f"virtfn{index}", d)
        if vf.netdev:
            self._netdev(d, vf.netdev)
        self._iommu(d, vf.address, self.groups.get(vf.address))

    def _common_files(
        self,
        d: Path,
        address: str,
        vendor: str,
        device: str,
        pci_class: str,
        numa_node: int,
        local: frozenset[int],
        driver: str | None,
        dev: PciSpec,
    ) -> None:
        self.files.mkdir(d)
        subvendor = dev.subsystem_vendor or vendor
        self.files.attributes(d, {
            "vendor": vendor, "device": device, "class": pci_class, "subsystem_vendor": subvendor,
            "subsystem_device": dev.subsystem_device, "revision": dev.revision, "numa_node": numa_node,
            "local_cpus": kernel_mask(local, self.nbits),
        })
        self.files.write(d / "local_cpulist", list_line(local))
        self.files.attributes(d, {
            "enable": 1, "irq": 0, "dma_mask_bits": 64, "consistent_dma_mask_bits": 64,
            "driver_override": "(null)", "broken_parity_status": 0, "msi_bus": 1,
            "current_link_speed": dev.link_speed, "current_link_width": dev.link_width,
            "max_link_speed": dev.link_speed, "max_link_width": dev.link_width,
        })
        self.files.write(
            d / "resource",
            "".join(
                "0x0000000000000000 0x0000000000000000 0x0000000000000000\n" for _ in range(13)
            ),
        )
        cls = int(pci_class, 16)
        ven, dv, sv, sd = (int(x, 16) for x in (vendor, device, subvendor, dev.subsystem_device))
        modalias = (
            f"pci:v{ven:08X}d{dv:08X}sv{sv:08X}sd{sd:08X}"
            f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
        )
        self.files.write(d / "modalias", modalias + "\n")
        uevent = [f"DRIVER={driver}"] if driver else []
        uevent += [
            f"PCI_CLASS={cls:X}",
            f"PCI_ID={ven:04X}:{dv:04X}",
            f"PCI_SUBSYS_ID={sv:04X}:{sd:04X}",
            f"PCI_SLOT_NAME={address}",
            f"MODALIAS={modalias}",
        ]
        self.files.write(d / "uevent", "\n".join(uevent) + "\n")
        self.files.write(d / "config", self._config_space(dev, vendor, device, pci_class))
        self.files.link(d / "subsystem", self.sys / "bus" / "pci")
        self.files.link(self.sys / "bus" / "pci" / "devices" / address, d)
        if driver:
            drv = self.sys / "bus" / "pci" / "drivers" / driver
            if not drv.exists():
                for name in ("bind", "unbind", "new_id", "remove_id"):
                    self.files.write(drv / name, "")
                self.files.write(drv / "uevent", "")
            self.files.link(drv / address, d)
            self.files.link(d / "driver", drv)

    def _config_space(self, dev: PciSpec, vendor: str, device: str, pci_class: str) -> bytes:
        cfg = bytearray(256)
        cls = int(pci_class, 16)
        cfg[0:2] = int(vendor, 16).to_bytes(2, "little")
        cfg[2:4] = int(device, 16).to_bytes(2, "little")
        cfg[4:6] = (0x0006).to_bytes(2, "little")  # memory space + bus master
        cfg[8] = int(dev.revision, 16) & 0xFF
        cfg[9] = cls & 0xFF
        cfg[10] = (cls >> 8) & 0xFF
        cfg[11] = (cls >> 16) & 0xFF
        cfg[0x0C] = 0x10  # cache line size (dwords)
        if dev.is_bridge:
            secondary, subordinate = self._bridge_buses(dev)
            cfg[0x0E] = 0x01
            cfg[0x18] = dev.bus
            cfg[0x19] = secondary
            cfg[0x1A] = subordinate
        else:
            cfg[0x0E] = 0x00
            cfg[0x2C:0x2E] = int(dev.subsystem_vendor or vendor, 16).to_bytes(2, "little")
            cfg[0x2E:0x30] = int(dev.subsystem_device, 16).to_bytes(2, "little")
        return bytes(cfg)

    def _netdev(self, dev_dir: Path, name: str) -> None:
        ifindex = self._next_ifindex
        self._next_ifindex += 1
        d = dev_dir / "net" / name
        mac = f"02:00:00:00:{ifindex >> 8 & 0xFF:02x}:{ifindex & 0xFF:02x}"
        self._interface(d, name, ifindex, {"address": mac, "ifindex": ifindex, "iflink": ifindex,
                                           "operstate": "up", "carrier": 1, "mtu": 1500, "type": 1, "dev_port": 0})
        self.files.link(d / "device", dev_dir)

    def write_net_loopback(self) -> None:
        d = self.devices_dir / "virtual" / "net" / "lo"
        self._interface(d, "lo", 1, {"address": "00:00:00:00:00:00", "ifindex": 1, "iflink": 1,
                                     "operstate": "unknown", "mtu": 65536, "type": 772})

    def _interface(self, d: Path, name: str, ifindex: int, attributes: dict[str, object]) -> None:
        """A network interface's directory ``d``, its attributes and its ``class/net`` entry."""
        self.files.attributes(d, attributes)
        self.files.write(d / "uevent", f"INTERFACE={name}\nIFINDEX={ifindex}\n")
        self.files.link(d / "subsystem", self.sys / "class" / "net")
        self.files.link(self.sys / "class" / "net" / name, d)

    def _iommu(self, dev_dir: Path, address: str, group: int | None) -> None:
        if group is None:
            return
        g = self.sys / "kernel" / "iommu_groups" / str(group)
        if not (g / "type").exists():
            self.files.write(g / "type", "DMA-FQ\n")
            self.files.write(g / "reserved_regions", "0x00000000fee00000 0x00000000feefffff msi\n")
        self.files.link(g / "devices" / address, dev_dir)
        self.files.link(dev_dir / "iommu_group", g)

    def _write_nvidia(self, dev: PciSpec) -> None:
        d = self.proc / "driver" / "nvidia" / "gpus" / dev.address
        self.files.write(d / "information", nvidia_information(dev))


__all__ = ["PciWriter"]
