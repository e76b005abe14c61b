// The native core: move one aligned byte range between memory and an open file.
//
// Python plans the request (alignment, bounce buffers, intra-op split); each engine here only
// splits an already aligned range into block_size pieces and keeps up to queue_depth of them in
// flight. Results are returned as numbers, never exceptions: >= 0 is the count of bytes moved
// from the start of the range (short only at end of file), < 0 is -errno.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsaio {

struct Tuning {
  uint64_t block_size;
  int queue_depth;
  bool single_submit;   // one submit call per block instead of one per batch
  bool overlap_events;  // refill the queue as each block completes instead of per batch
};

struct Range {
  int fd;
  char* buf;
  uint64_t nbytes;
  int64_t offset;
  bool is_read;
};

// One block of a range, as handed to a kernel queue.
struct Block {
  uint64_t index;
  char* buf;
  uint64_t len;
  int64_t off;
};

struct Completion {
  uint64_t index;
  int64_t res;
};

// A kernel submission queue (Linux AIO context or io_uring instance) of a fixed depth.
class Queue {
 public:
  virtual ~Queue() = default;
  virtual int depth() const = 0;
  // Submits blocks[0..n); returns how many the kernel took, or -errno.
  virtual int submit(const Block* blocks, int n, int fd, bool is_read) = 0;
  // Waits for at least min_nr completions (at most max_nr); returns the count, or -errno.
  virtual int reap(Completion* out, int min_nr, int max_nr) = 0;
};

std::vector<Block> split_blocks(const Range& r, uint64_t block_size);
// Bytes moved from the start of the range given per-block results, or the first -errno.
int64_t total_from_results(const std::vector<Block>& blocks, const std::vector<int64_t>& results);
// Runs a range through a kernel queue with the tuning's submit / overlap policy.
int64_t drive(Queue& q, const Range& r, const Tuning& t);

int64_t aio_transfer(const Range& r, const Tuning& t);
int64_t uring_transfer(const Range& r, const Tuning& t);
int64_t threads_transfer(const Range& r, const Tuning& t);

// Whether the engine's system calls work here; on failure `why` says what refused them.
bool aio_probe(std::string& why);
bool uring_probe(std::string& why);

// zlib-compatible CRC-32 of n bytes, continuing from `crc` (0 to start), as zlib.crc32(data, crc).
uint32_t crc32(uint32_t crc, const char* data, uint64_t n);

}  // namespace dsaio
