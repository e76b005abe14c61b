// Linux native AIO through raw system calls (no libaio): io_setup, io_submit, io_getevents.
#include <linux/aio_abi.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine.h"
#include "pool.h"

namespace dsaio {

namespace {

long sys_io_setup(unsigned nr, aio_context_t* ctx) { return syscall(SYS_io_setup, nr, ctx); }
long sys_io_destroy(aio_context_t ctx) { return syscall(SYS_io_destroy, ctx); }
long sys_io_submit(aio_context_t ctx, long n, iocb** cbs) { return syscall(SYS_io_submit, ctx, n, cbs); }
long sys_io_getevents(aio_context_t ctx, long min_nr, long nr, io_event* ev) {
  return syscall(SYS_io_getevents, ctx, min_nr, nr, ev, nullptr);
}

class AioQueue : public Queue {
 public:
  static std::unique_ptr<AioQueue> create(int depth, int& err) {
    aio_context_t ctx = 0;
    if (sys_io_setup(static_cast<unsigned>(depth), &ctx) < 0) {
      err = errno;
      return nullptr;
    }
    return std::unique_ptr<AioQueue>(new AioQueue(ctx, depth));
  }
  ~AioQueue() override { sys_io_destroy(ctx_); }

  int depth() const override { return depth_; }

  int submit(const Block* blocks, int n, int fd, bool is_read) override {
    // The kernel copies each iocb during io_submit, so these can live on our side only briefly.
    for (int i = 0; i < n; ++i) {
      iocb& cb = cbs_[i];
      std::memset(&cb, 0, sizeof(cb));
      cb.aio_data = blocks[i].index;
      cb.aio_lio_opcode = is_read ? IOCB_CMD_PREAD : IOCB_CMD_PWRITE;
      cb.aio_fildes = static_cast<__u32>(fd);
      cb.aio_buf = reinterpret_cast<__u64>(blocks[i].buf);
      cb.aio_nbytes = blocks[i].len;
      cb.aio_offset = blocks[i].off;
      ptrs_[i] = &cb;
    }
    long got = sys_io_submit(ctx_, n, ptrs_.data());
    return got < 0 ? -errno : static_cast<int>(got);
  }

  int reap(Completion* out, int min_nr, int max_nr) override {
    long got = sys_io_getevents(ctx_, min_nr, max_nr, events_.data());
    if (got < 0) return -errno;
    for (long i = 0; i < got; ++i) out[i] = Completion{events_[i].data, events_[i].res};
    return static_cast<int>(got);
  }

 private:
  AioQueue(aio_context_t ctx, int depth)
      : ctx_(ctx), depth_(depth), cbs_(depth), ptrs_(depth), events_(depth) {}

  aio_context_t ctx_;
  int depth_;
  std::vector<iocb> cbs_;
  std::vector<iocb*> ptrs_;
  std::vector<io_event> events_;
};

QueuePool<AioQueue> pool;

}  // namespace

int64_t aio_transfer(const Range& r, const Tuning& t) { return run_pooled(pool, r, t); }

bool aio_probe(std::string& why) {
  int err = 0;
  std::unique_ptr<AioQueue> q = AioQueue::create(1, err);
  if (q) return true;
  why = std::string("io_setup failed: ") + std::strerror(err) +
        (err == ENOSYS || err == EPERM ? " (blocked by the kernel or a seccomp filter)" : "") +
        (err == EAGAIN ? " (fs.aio-max-nr reached)" : "");
  return false;
}

}  // namespace dsaio
