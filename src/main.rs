fn main() {
    println!("kvprobe");
}
