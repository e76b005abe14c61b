// Block splitting and the submit / reap loop shared by the Linux AIO and io_uring engines.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>

#include "engine.h"

namespace dsaio {

std::vector<Block> split_blocks(const Range& r, uint64_t block_size) {
  std::vector<Block> blocks;
  if (block_size == 0) block_size = r.nbytes ? r.nbytes : 1;
  blocks.reserve(r.nbytes / block_size + 1);
  for (uint64_t done = 0, i = 0; done < r.nbytes; ++i) {
    uint64_t len = std::min(block_size, r.nbytes - done);
    blocks.push_back(Block{i, r.buf + done, len, r.offset + static_cast<int64_t>(done)});
    done += len;
  }
  return blocks;
}

int64_t total_from_results(const std::vector<Block>& blocks, const std::vector<int64_t>& results) {
  // An error anywhere wins over a short count: nothing may come back silently short.
  for (int64_t res : results)
    if (res < 0) return res;
  int64_t total = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    total += results[i];
    if (static_cast<uint64_t>(results[i]) < blocks[i].len) break;  // end of file
  }
  return total;
}

// A short write from the kernel (rare: usually the disk filling) is finished with plain
// pwrite so the caller gets either every byte or the errno that stopped it.
static int64_t finish_short_write(const Range& r, const Block& b, int64_t res) {
  uint64_t done = static_cast<uint64_t>(res);
  while (done < b.len) {
    ssize_t n = pwrite(r.fd, b.buf + done, b.len - done, b.off + static_cast<int64_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    done += static_cast<uint64_t>(n);
  }
  return static_cast<int64_t>(done);
}

int64_t drive(Queue& q, const Range& r, const Tuning& t) {
  std::vector<Block> blocks = split_blocks(r, t.block_size);
  const int nblocks = static_cast<int>(blocks.size());
  std::vector<int64_t> results(blocks.size(), 0);
  std::vector<Completion> events(static_cast<size_t>(q.depth()));
  int next = 0, inflight = 0;
  int64_t failure = 0;

  while (next < nblocks || inflight > 0) {
    // Without overlap_events a new batch starts only once the previous one fully completed.
    int room = t.overlap_events ? q.depth() - inflight : (inflight == 0 ? q.depth() : 0);
    int batch = failure ? 0 : std::min(room, nblocks - next);
    while (batch > 0) {
      int want = t.single_submit ? 1 : batch;
      int got = q.submit(&blocks[next], want, r.fd, r.is_read);
      if (got == -EINTR) continue;
      if (got == -EAGAIN && inflight > 0) break;  // kernel queue full: reap, then resubmit
      if (got <= 0) {
        failure = got ? got : -EIO;
        break;
      }
      next += got;
      inflight += got;
      batch -= got;
    }
    if (inflight == 0) {
      if (failure) break;
      continue;
    }
    int min_nr = t.overlap_events ? 1 : inflight;
    int n = q.reap(events.data(), min_nr, inflight);
    if (n == -EINTR) continue;
    if (n < 0) return n;  // the queue itself broke: blocks in flight are lost with it
    for (int i = 0; i < n; ++i) {
      const Block& b = blocks[events[i].index];
      int64_t res = events[i].res;
      if (!r.is_read && res >= 0 && static_cast<uint64_t>(res) < b.len) res = finish_short_write(r, b, res);
      results[events[i].index] = res;
      if (res < 0 && !failure) failure = res;
    }
    inflight -= n;
  }
  if (failure) return failure;
  return total_from_results(blocks, results);
}

}  // namespace dsaio
