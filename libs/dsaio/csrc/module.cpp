// Python bindings: plain integers in and out, the GIL released for every transfer so that
// intra-op threads and async requests run in parallel.
#include <pybind11/pybind11.h>

#include <string>

#include "engine.h"

namespace py = pybind11;

namespace {

using TransferFn = int64_t (*)(const dsaio::Range&, const dsaio::Tuning&);

TransferFn engine_fn(const std::string& name) {
  if (name == "io_uring") return dsaio::uring_transfer;
  if (name == "aio") return dsaio::aio_transfer;
  if (name == "threads") return dsaio::threads_transfer;
  throw py::value_error("unknown native engine '" + name + "'; expected io_uring, aio or threads");
}

int64_t transfer(const std::string& engine, int fd, uintptr_t addr, uint64_t nbytes, int64_t offset,
                 bool is_read, uint64_t block_size, int queue_depth, bool single_submit, bool overlap_events) {
  TransferFn fn = engine_fn(engine);
  if (queue_depth < 1) throw py::value_error("queue_depth must be >= 1, got " + std::to_string(queue_depth));
  dsaio::Range r{fd, reinterpret_cast<char*>(addr), nbytes, offset, is_read};
  dsaio::Tuning t{block_size, queue_depth, single_submit, overlap_events};
  py::gil_scoped_release release;
  return fn(r, t);
}

uint32_t crc32(uintptr_t addr, uint64_t nbytes, uint32_t crc) {
  py::gil_scoped_release release;  // checksums run on worker threads beside the writes
  return dsaio::crc32(crc, reinterpret_cast<const char*>(addr), nbytes);
}

py::tuple probe(const std::string& engine) {
  std::string why;
  bool ok = true;
  if (engine == "io_uring") ok = dsaio::uring_probe(why);
  else if (engine == "aio") ok = dsaio::aio_probe(why);
  else engine_fn(engine);  // threads need no kernel support; unknown names raise
  return py::make_tuple(ok, why);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "dsaio's native I/O engines (Linux AIO, io_uring, pread/pwrite threads) over raw syscalls";
  m.def("transfer", &transfer, py::arg("engine"), py::arg("fd"), py::arg("addr"), py::arg("nbytes"),
        py::arg("offset"), py::arg("is_read"), py::arg("block_size"), py::arg("queue_depth"),
        py::arg("single_submit"), py::arg("overlap_events"),
        "Move an aligned range; returns bytes moved (short only at end of file) or -errno.");
  m.def("crc32", &crc32, py::arg("addr"), py::arg("nbytes"), py::arg("crc") = 0,
        "zlib.crc32 of the bytes at addr, several times faster where the CPU has PCLMULQDQ.");
  m.def("probe", &probe, py::arg("engine"), "(works, why_not) for one engine on this machine.");
}
