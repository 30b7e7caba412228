"""kubelet's CPU manager test topologies (``cpumanager/policy_test.go`` and friends), rebuilt.

Go leaves unset struct fields at 0, so where kubelet's fixture does not set ``NumNUMANodes``
or ``NumUncoreCache`` (or a CPU's ``UncoreCacheID``) these fixtures pass 0 explicitly; that
keeps kubelet's socket-first / NUMA-first choice and its uncore sizes (§1, §2).
"""

from __future__ import annotations

from numa_pin.base.cpuset import parse_list
from numa_pin.topology.cpus import CpuInfo, CpuTopology


def cpus(text: str) -> frozenset[int]:
    """``"0-3,8"`` -> frozenset, the way kubelet's tests write CPU sets."""
    return parse_list(text)


def _kubelet(infos, num_cores, num_sockets, num_numa_nodes=0, num_uncore=0):
    return CpuTopology.from_cpus(
        infos,
        num_cores=num_cores,
        num_sockets=num_sockets,
        num_numa_nodes=num_numa_nodes,
        num_uncore=num_uncore,
    )


# 1 socket, 4 cores, 2 threads: core i = {i, i+4}
SINGLE_SOCKET_HT = _kubelet([CpuInfo(c, 0, 0, c % 4, 0) for c in range(8)], 4, 1)

# 2 sockets x 3 cores x 2 threads; socket0 cores {0,6},{2,8},{4,10}, socket1 {1,7},{3,9},{5,11}
DUAL_SOCKET_HT = _kubelet([CpuInfo(c, c % 2, c % 2, c % 6, 0) for c in range(12)], 6, 2)

# 2 sockets x 4 cores, no SMT
DUAL_SOCKET_NO_HT = _kubelet([CpuInfo(c, c // 4, c // 4, c, 0) for c in range(8)], 8, 2)

# fake 3-socket machine: CPUs 0-5 on socket 1, 6-11 on socket 0, 12-17 on socket 2
_TRIPLE_SOCKET = {0: 1, 1: 0, 2: 2}
TRIPLE_SOCKET_HT = _kubelet(
    [CpuInfo(c, _TRIPLE_SOCKET[c // 6], _TRIPLE_SOCKET[c // 6], c // 2, 0) for c in range(18)], 9, 3
)

# KNL SNC4 machine: 4 sockets (= NUMA nodes) x 18 cores x 4 threads, core ids unique
_QUAD_CORES = {
    0: {
        0: (0, 169, 109, 229), 1: (50, 170, 110, 230), 64: (1, 25, 13, 38), 65: (2, 26, 14, 39),
        72: (9, 33, 21, 46), 73: (10, 34, 22, 47), 8: (57, 177, 117, 237), 9: (58, 178, 118, 238),
        24: (71, 191, 131, 251), 25: (72, 192, 132, 252), 32: (79, 199, 139, 259),
        33: (80, 200, 140, 260), 40: (87, 207, 147, 267), 41: (88, 208, 148, 268),
        48: (95, 215, 155, 275), 49: (96, 216, 156, 276), 56: (103, 223, 163, 283),
        57: (104, 224, 164, 284),
    },
    1: {
        66: (3, 27, 15, 40), 67: (4, 28, 16, 41), 74: (11, 35, 23, 48), 75: (12, 36, 24, 49),
        2: (51, 171, 111, 231), 3: (52, 172, 112, 232), 10: (59, 179, 119, 239),
        11: (60, 180, 120, 240), 18: (65, 185, 125, 245), 19: (66, 186, 126, 246),
        26: (73, 193, 133, 253), 27: (74, 194, 134, 254), 34: (81, 201, 141, 261),
        35: (82, 202, 142, 262), 42: (89, 209, 149, 269), 43: (90, 210, 150, 270),
        50: (97, 217, 157, 277), 51: (98, 218, 158, 278),
    },
    2: {
        68: (5, 29, 17, 42), 69: (6, 30, 18, 43), 4: (53, 173, 113, 233), 5: (54, 174, 114, 234),
        12: (61, 181, 121, 241), 13: (62, 182, 122, 242), 20: (67, 187, 127, 247),
        21: (68, 188, 128, 248), 28: (75, 195, 135, 255), 29: (76, 196, 136, 256),
        36: (83, 203, 143, 263), 37: (84, 204, 144, 264), 44: (91, 211, 151, 271),
        45: (92, 212, 152, 272), 52: (99, 219, 159, 279), 53: (100, 220, 160, 280),
        60: (105, 225, 165, 285), 61: (106, 226, 166, 286),
    },
    3: {
        70: (7, 31, 19, 44), 71: (8, 32, 20, 45), 63: (37, 168, 108, 228),
        62: (107, 227, 167, 287), 6: (55, 175, 115, 235), 7: (56, 176, 116, 236),
        14: (63, 183, 123, 243), 15: (64, 184, 124, 244), 22: (69, 189, 129, 249),
        23: (70, 190, 130, 250), 30: (77, 197, 137, 257), 31: (78, 198, 138, 258),
        38: (85, 205, 145, 265), 39: (86, 206, 146, 266), 46: (93, 213, 153, 273),
        47: (94, 214, 154, 274), 54: (101, 221, 161, 281), 55: (102, 222, 162, 282),
    },
}
QUAD_SOCKET_FOUR_WAY_HT = _kubelet(
    [
        CpuInfo(cpu, socket, socket, core, 0)
        for socket, cores in _QUAD_CORES.items()
        for core, threads in cores.items()
        for cpu in threads
    ],
    72,
    4,
)
#: the per-socket CPU lists printed in kubelet's comment above the quad fixture
QUAD_SOCKET_LISTS = {
    0: "0-2,9-10,13-14,21-22,25-26,33-34,38-39,46-47,50,57-58,71-72,79-80,87-88,95-96,103-104,"
    "109-110,117-118,131-132,139-140,147-148,155-156,163-164,169-170,177-178,191-192,199-200,"
    "207-208,215-216,223-224,229-230,237-238,251-252,259-260,267-268,275-276,283-284",
    1: "3-4,11-12,15-16,23-24,27-28,35-36,40-41,48-49,51-52,59-60,65-66,73-74,81-82,89-90,97-98,"
    "111-112,119-120,125-126,133-134,141-142,149-150,157-158,171-172,179-180,185-186,193-194,"
    "201-202,209-210,217-218,231-232,239-240,245-246,253-254,261-262,269-270,277-278",
    2: "5-6,17-18,29-30,42-43,53-54,61-62,67-68,75-76,83-84,91-92,99-100,105-106,113-114,121-122,"
    "127-128,135-136,143-144,151-152,159-160,165-166,173-174,181-182,187-188,195-196,203-204,"
    "211-212,219-220,225-226,233-234,241-242,247-248,255-256,263-264,271-272,279-280,285-286",
    3: "7-8,19-20,31-32,37,44-45,55-56,63-64,69-70,77-78,85-86,93-94,101-102,107-108,115-116,"
    "123-124,129-130,137-138,145-146,153-154,161-162,167-168,175-176,183-184,189-190,197-198,"
    "205-206,213-214,221-222,227-228,235-236,243-244,249-250,257-258,265-266,273-274,281-282,287",
}

# dual Xeon Gold 6230: 2 sockets, 4 NUMA nodes (0-9,40-49 | 10-19,50-59 | 20-29,60-69 | 30-39,70-79)
DUAL_SOCKET_MULTI_NUMA_HT = _kubelet(
    [CpuInfo(c, (c % 40) // 20, (c % 40) // 10, c % 40, 0) for c in range(80)], 40, 2, 4
)

# the same machine with sockets and NUMA nodes flipped: 4 sockets, 2 NUMA nodes
FAKE_MULTI_SOCKET_DUAL_NUMA_HT = _kubelet(
    [CpuInfo(c, (c % 40) // 10, (c % 40) // 20, c % 40, 0) for c in range(80)], 40, 4, 2
)

# dual AMD EPYC 7742, NPS=4: 8 NUMA nodes of 16 cores, core i = {i, i+128}
DUAL_SOCKET_MULTI_NUMA_HT_LARGE = _kubelet(
    [CpuInfo(c, (c % 128) // 64, (c % 128) // 16, c % 128, 0) for c in range(256)], 128, 2, 8
)

# uncore fixtures (NumUncoreCache set): 4 CPUs per L3
UNCORE_SINGLE_SOCKET_MULTI_NUMA = _kubelet(
    [CpuInfo(c, 0, c // 8, c, c // 4) for c in range(16)], 16, 1, 2, 4
)
UNCORE_DUAL_SOCKET_NO_SMT = _kubelet(
    [CpuInfo(c, c // 8, c // 8, c, c // 4) for c in range(16)], 16, 2, 2, 4
)
# 1 socket, 8 cores x 2 threads (core i = {i, i+8}); L3 0 = cores 0-3, L3 1 = cores 4-7
UNCORE_SINGLE_SOCKET_SMT = _kubelet(
    [CpuInfo(c, 0, 0, c % 8, (c % 8) // 4) for c in range(16)], 8, 1, 1, 2
)
# kubelet's topoUncoreSingleSocketNoSMT is not in the stored sources; rebuilt by hand as the
# single-NUMA twin of UNCORE_SINGLE_SOCKET_MULTI_NUMA (16 CPUs, 4 L3 of 4 CPUs each)
UNCORE_SINGLE_SOCKET_NO_SMT = _kubelet(
    [CpuInfo(c, 0, 0, c, c // 4) for c in range(16)], 16, 1, 1, 4
)

# the machine of kubelet's topology_hints_test.go (cAdvisor Discover, so counts are distinct ids):
# NUMA 0 / socket 0 cores {0,6},{1,7},{2,8}; NUMA 1 / socket 1 cores {3,9},{4,10},{5,11}
HINTS_MACHINE = CpuTopology.from_cpus(
    [CpuInfo(c, (c % 6) // 3, (c % 6) // 3, c % 6) for c in range(12)]
)
