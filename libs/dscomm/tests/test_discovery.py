"""The rank environment of each launcher (torchrun, OpenMPI, MVAPICH, MPICH / Intel MPI, SLURM) read as
torch.distributed's: pure, from environment mappings as each launcher sets them (recorded from OpenMPI
4.1 and SLURM 22.05 on this machine, and from the MPICH, Intel MPI and MVAPICH documentation)."""

import pytest

from dscomm.discovery import discover, first_host, tasks_per_node

# Rank 1 of 4, two per machine, as each launcher describes it.
OPENMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "PMIX_RANK": "1"}
MVAPICH = {"MV2_COMM_WORLD_RANK": "1", "MV2_COMM_WORLD_SIZE": "4", "MV2_COMM_WORLD_LOCAL_RANK": "1",
           "MV2_COMM_WORLD_LOCAL_SIZE": "2"}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "5"}
CRAY_PALS = {"PMIX_RANK": "1", "PMI_SIZE": "4", "PALS_LOCAL_RANKID": "1", "PALS_LOCAL_SIZE": "2"}
SLURM = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4",
         "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
         "SLURM_STEP_NODELIST": "gpu-[07-08]", "SLURM_NODELIST": "gpu-[07-08]", "SLURM_JOB_NODELIST": "gpu-[07-08]"}


@pytest.mark.parametrize(("environ", "source"), [
    (OPENMPI, "OpenMPI"), (MVAPICH, "MVAPICH"), (MPICH, "MPICH / Intel MPI (PMI)"),
    (CRAY_PALS, "MPICH / Intel MPI (PMI)"), (SLURM, "SLURM")])
def test_each_launcher_becomes_torchs_variables(environ, source):
    found = discover({**environ, "MASTER_ADDR": "node-a"}, distributed_port=29511)
    assert found.source == source
    assert found.torch_environment() == {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                         "MASTER_ADDR": "node-a", "MASTER_PORT": "29511"}


def test_master_port_from_the_environment_wins_over_the_default():
    assert discover({**OPENMPI, "MASTER_ADDR": "a", "MASTER_PORT": "31000"}).master_port == 31000
    assert discover({**OPENMPI, "MASTER_ADDR": "a"}).master_port == 29500  # DeepSpeed's distributed_port


def test_one_machine_rendezvous_on_loopback_without_master_addr():
    one_machine = {**OPENMPI, "OMPI_COMM_WORLD_SIZE": "2"}
    assert discover(one_machine).master_addr == "127.0.0.1"
    slurm_one_node = {**SLURM, "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2",
                      "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "gpu-07"}
    assert discover(slurm_one_node).master_addr == "127.0.0.1"


def test_slurm_across_nodes_meets_on_the_steps_first_node():
    assert discover(SLURM).master_addr == "gpu-07"
    # srun starting MPI ranks (--mpi=pmi2): PMI's rank, SLURM's local rank and node list.
    pmi_under_srun = {**SLURM, "PMI_RANK": "1", "PMI_SIZE": "4"}
    found = discover(pmi_under_srun)
    assert (found.source, found.local_rank, found.local_world_size, found.master_addr) == \
        ("MPICH / Intel MPI (PMI)", 1, 2, "gpu-07")


def test_mpi_across_machines_without_master_addr_says_what_to_set():
    with pytest.raises(ValueError, match=r"OpenMPI: rank 1 of 4 runs across machines.*mpirun -x MASTER_ADDR"):
        discover(OPENMPI)


def test_mpi_wins_over_the_slurm_step_of_its_daemons():
    # mpirun inside an allocation starts its daemons with srun: the ranks inherit that step (2 daemons).
    daemons = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_ID": "1"}
    found = discover({**OPENMPI, **daemons, "MASTER_ADDR": "a"})
    assert (found.source, found.rank, found.world_size) == ("OpenMPI", 1, 4)


def test_a_batch_script_is_not_a_slurm_step():
    batch = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "gpu-07"}
    assert discover(batch) is None  # a plain `python train.py` in an sbatch script: a world of one
    assert discover({}) is None


def test_torchrun_variables_are_taken_as_they_are():
    torchrun = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
                "MASTER_PORT": "1234"}
    found = discover({**torchrun, **OPENMPI})  # all five set: nothing to discover, as in DeepSpeed
    assert (found.source, found.rank, found.master_port) == ("torchrun", 3, 1234)


@pytest.mark.parametrize(("environ", "message"), [
    ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "one"}, "OMPI_COMM_WORLD_RANK='one' is not an integer"),
    ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "4"}, "rank 4 is outside 0..3"),
    ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, "local rank 2 is outside 0..1"),
    ({**MPICH, "PMIX_RANK": "2"}, "PMI_RANK='1', PMIX_RANK='2' disagree"),
    ({**MPICH, "RANK": "0", "MASTER_ADDR": "a"}, r"RANK='0' is set, but MPICH / Intel MPI \(PMI\) says 1"),
    ({**OPENMPI, "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, "MASTER_PORT 70000 is not a TCP port"),
    ({k: v for k, v in MVAPICH.items() if "LOCAL_RANK" not in k}, "has no local rank; expected one of "
                                                                  "MV2_COMM_WORLD_LOCAL_RANK"),
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2*2"}, r"'2\*2' is not N or N\(xM\)"),
])
def test_bad_launcher_environments_are_named(environ, message):
    with pytest.raises(ValueError, match=message):
        discover({"MASTER_ADDR": "a", **environ})


def test_slurm_host_lists_and_task_counts():
    assert first_host("gpu-[07,01-03],cpu1") == "gpu-07"
    assert first_host("node001") == "node001"
    assert first_host("rack[2-3]-n[010-011]") == "rack2-n010"
    assert first_host("a,b[1-2]") == "a"
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ValueError, match="cannot read a host name"):
        first_host("[")
