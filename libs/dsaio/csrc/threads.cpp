// The engine for where neither Linux AIO nor io_uring is allowed (seccomp in some containers):
// up to queue_depth worker threads doing plain pread / pwrite, one block at a time each.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>

#include "engine.h"

namespace dsaio {

namespace {

int64_t move_block(const Range& r, const Block& b) {
  uint64_t done = 0;
  while (done < b.len) {
    char* p = b.buf + done;
    int64_t off = b.off + static_cast<int64_t>(done);
    ssize_t n = r.is_read ? pread(r.fd, p, b.len - done, off) : pwrite(r.fd, p, b.len - done, off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) {
      if (r.is_read) break;  // end of file
      return -EIO;
    }
    done += static_cast<uint64_t>(n);
  }
  return static_cast<int64_t>(done);
}

}  // namespace

int64_t threads_transfer(const Range& r, const Tuning& t) {
  std::vector<Block> blocks = split_blocks(r, t.block_size);
  std::vector<int64_t> results(blocks.size(), 0);
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t i = next++; i < blocks.size(); i = next++) results[i] = move_block(r, blocks[i]);
  };
  size_t workers = std::min<size_t>(static_cast<size_t>(std::max(t.queue_depth, 1)), blocks.size());
  std::vector<std::thread> pool;
  for (size_t i = 1; i < workers; ++i) pool.emplace_back(work);
  work();  // the calling thread is one of the workers
  for (auto& th : pool) th.join();
  return total_from_results(blocks, results);
}

}  // namespace dsaio
