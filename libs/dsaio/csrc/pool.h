// A small cache of kernel queues so each request does not pay io_setup / io_uring_setup.
// Queues are per depth; a forked child drops (and leaks) its parent's queues, which it cannot use.
#pragma once

#include <unistd.h>

#include <memory>
#include <mutex>
#include <vector>

namespace dsaio {

template <class Q>
class QueuePool {
 public:
  std::unique_ptr<Q> take(int depth) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_if_forked();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i]->depth() == depth) {
        std::unique_ptr<Q> q = std::move(free_[i]);
        free_.erase(free_.begin() + static_cast<long>(i));
        return q;
      }
    }
    return nullptr;
  }

  void give_back(std::unique_ptr<Q> q) {
    std::lock_guard<std::mutex> lock(mutex_);
    forget_if_forked();
    if (free_.size() < kMaxIdle) free_.push_back(std::move(q));
  }

 private:
  static constexpr size_t kMaxIdle = 16;

  void forget_if_forked() {
    pid_t now = getpid();
    if (now == pid_) return;
    for (auto& q : free_) q.release();  // the parent's kernel objects are not ours to close
    free_.clear();
    pid_ = now;
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<Q>> free_;
  pid_t pid_ = getpid();
};

// Borrows a queue from the pool (creating one if needed) and runs the range through it.
template <class Q>
int64_t run_pooled(QueuePool<Q>& pool, const Range& r, const Tuning& t) {
  std::unique_ptr<Q> q = pool.take(t.queue_depth);
  if (!q) {
    int err = 0;
    q = Q::create(t.queue_depth, err);
    if (!q) return -err;
  }
  int64_t res = drive(*q, r, t);
  if (res >= 0) pool.give_back(std::move(q));  // a queue that failed mid-flight is not reused
  return res;
}

}  // namespace dsaio
