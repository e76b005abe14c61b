// io_uring through raw system calls (no liburing): io_uring_setup, mmap of the rings,
// io_uring_enter. The ring head/tail words are shared with the kernel, hence the
// acquire/release atomics on them.
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine.h"
#include "pool.h"

namespace dsaio {

namespace {

int sys_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(syscall(__NR_io_uring_setup, entries, p));
}
int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags) {
  return static_cast<int>(syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, nullptr, 0));
}

template <class T>
T* at(void* base, unsigned off) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + off);
}

class UringQueue : public Queue {
 public:
  static std::unique_ptr<UringQueue> create(int depth, int& err) {
    io_uring_params p;
    std::memset(&p, 0, sizeof(p));
    int fd = sys_setup(static_cast<unsigned>(depth), &p);
    if (fd < 0) {
      err = errno;
      return nullptr;
    }
    std::unique_ptr<UringQueue> q(new UringQueue(fd, depth));
    if (!q->map(p, err)) return nullptr;
    return q;
  }

  ~UringQueue() override {
    if (sqes_ != MAP_FAILED) munmap(sqes_, sqes_size_);
    if (cq_ptr_ != MAP_FAILED && cq_ptr_ != sq_ptr_) munmap(cq_ptr_, cq_size_);
    if (sq_ptr_ != MAP_FAILED) munmap(sq_ptr_, sq_size_);
    close(fd_);
  }

  int depth() const override { return depth_; }

  int submit(const Block* blocks, int n, int fd, bool is_read) override {
    unsigned tail = *sq_tail_;  // only we write the SQ tail
    unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
    n = std::min<int>(n, static_cast<int>(sq_entries_ - (tail - head)));
    for (int i = 0; i < n; ++i) {
      unsigned idx = (tail + static_cast<unsigned>(i)) & sq_mask_;
      io_uring_sqe* sqe = &sqes_[idx];
      std::memset(sqe, 0, sizeof(*sqe));
      sqe->opcode = is_read ? IORING_OP_READ : IORING_OP_WRITE;
      sqe->fd = fd;
      sqe->addr = reinterpret_cast<__u64>(blocks[i].buf);
      sqe->len = static_cast<__u32>(blocks[i].len);
      sqe->off = static_cast<__u64>(blocks[i].off);
      sqe->user_data = blocks[i].index;
      sq_array_[idx] = idx;
    }
    __atomic_store_n(sq_tail_, tail + static_cast<unsigned>(n), __ATOMIC_RELEASE);
    int got = sys_enter(fd_, static_cast<unsigned>(n), 0, 0);
    if (got < 0) {
      // Nothing consumed: take the entries back so the ring stays consistent.
      __atomic_store_n(sq_tail_, tail, __ATOMIC_RELEASE);
      return -errno;
    }
    // Without SQPOLL the kernel consumes entries only inside io_uring_enter, so the ones it left
    // can be withdrawn; the driver resubmits them.
    if (got < n) __atomic_store_n(sq_tail_, tail + static_cast<unsigned>(got), __ATOMIC_RELEASE);
    return got;
  }

  int reap(Completion* out, int min_nr, int max_nr) override {
    int got = harvest(out, max_nr);
    while (got < min_nr) {
      int rc = sys_enter(fd_, 0, static_cast<unsigned>(min_nr - got), IORING_ENTER_GETEVENTS);
      if (rc < 0 && errno != EINTR) return got ? got : -errno;
      got += harvest(out + got, max_nr - got);
    }
    return got;
  }

 private:
  UringQueue(int fd, int depth) : fd_(fd), depth_(depth) {}

  bool map(const io_uring_params& p, int& err) {
    sq_size_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_size_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    bool single = p.features & IORING_FEAT_SINGLE_MMAP;
    if (single) sq_size_ = cq_size_ = std::max(sq_size_, cq_size_);
    sq_ptr_ = mmap(nullptr, sq_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQ_RING);
    if (sq_ptr_ == MAP_FAILED) return fail(err);
    cq_ptr_ = single ? sq_ptr_
                     : mmap(nullptr, cq_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                            IORING_OFF_CQ_RING);
    if (cq_ptr_ == MAP_FAILED) return fail(err);
    sqes_size_ = p.sq_entries * sizeof(io_uring_sqe);
    void* sqes = mmap(nullptr, sqes_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
    if (sqes == MAP_FAILED) return fail(err);
    sqes_ = static_cast<io_uring_sqe*>(sqes);
    sq_head_ = at<unsigned>(sq_ptr_, p.sq_off.head);
    sq_tail_ = at<unsigned>(sq_ptr_, p.sq_off.tail);
    sq_mask_ = *at<unsigned>(sq_ptr_, p.sq_off.ring_mask);
    sq_entries_ = *at<unsigned>(sq_ptr_, p.sq_off.ring_entries);
    sq_array_ = at<unsigned>(sq_ptr_, p.sq_off.array);
    cq_head_ = at<unsigned>(cq_ptr_, p.cq_off.head);
    cq_tail_ = at<unsigned>(cq_ptr_, p.cq_off.tail);
    cq_mask_ = *at<unsigned>(cq_ptr_, p.cq_off.ring_mask);
    cqes_ = at<io_uring_cqe>(cq_ptr_, p.cq_off.cqes);
    return true;
  }

  static bool fail(int& err) {
    err = errno;
    return false;
  }

  int harvest(Completion* out, int max_nr) {
    unsigned head = *cq_head_;  // only we advance the CQ head
    unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
    int n = 0;
    for (; head != tail && n < max_nr; ++head, ++n) {
      const io_uring_cqe& cqe = cqes_[head & cq_mask_];
      out[n] = Completion{cqe.user_data, cqe.res};
    }
    __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
    return n;
  }

  int fd_;
  int depth_;
  void* sq_ptr_ = MAP_FAILED;
  void* cq_ptr_ = MAP_FAILED;
  io_uring_sqe* sqes_ = static_cast<io_uring_sqe*>(MAP_FAILED);
  size_t sq_size_ = 0, cq_size_ = 0, sqes_size_ = 0;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_array_ = nullptr;
  unsigned sq_mask_ = 0, sq_entries_ = 0;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr;
  unsigned cq_mask_ = 0;
  io_uring_cqe* cqes_ = nullptr;
};

QueuePool<UringQueue> pool;

}  // namespace

int64_t uring_transfer(const Range& r, const Tuning& t) { return run_pooled(pool, r, t); }

bool uring_probe(std::string& why) {
  int err = 0;
  std::unique_ptr<UringQueue> q = UringQueue::create(1, err);
  if (q) return true;
  why = std::string("io_uring_setup failed: ") + std::strerror(err) +
        (err == ENOSYS || err == EPERM ? " (disabled by kernel.io_uring_disabled or a seccomp filter)" : "");
  return false;
}

}  // namespace dsaio
