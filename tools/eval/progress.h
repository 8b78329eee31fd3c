// A progress bar with ETA on stderr for long commands (redrawn at most a few times a second;
// drawn only when stderr is a terminal).
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace squeezekv::eval {

class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled = true)
      : label_(std::move(label)), total_(total), enabled_(enabled && isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}
  ~Progress() { finish(); }

  void update(int64_t done) {
    if (!enabled_ || total_ <= 0) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(250)) return;
    last_ = now;
    const double el = std::chrono::duration<double>(now - start_).count();
    const double frac = static_cast<double>(done) / static_cast<double>(total_);
    const double eta = done > 0 ? el * (1.0 - frac) / frac : 0.0;
    char bar[31];
    const int filled = static_cast<int>(frac * 30);
    for (int i = 0; i < 30; ++i) bar[i] = i < filled ? '#' : '.';
    bar[30] = '\0';
    std::fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld elapsed %s ETA %s   ", label_.c_str(), bar,
                 static_cast<int>(frac * 100), static_cast<long long>(done), static_cast<long long>(total_),
                 fmt(el).c_str(), done > 0 ? fmt(eta).c_str() : "?");
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  static std::string fmt(double s) {
    char b[32];
    const int t = static_cast<int>(s + 0.5);
    if (t >= 3600)
      std::snprintf(b, sizeof b, "%dh%02dm", t / 3600, t / 60 % 60);
    else
      std::snprintf(b, sizeof b, "%dm%02ds", t / 60, t % 60);
    return b;
  }
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_{};
};

}  // namespace squeezekv::eval
